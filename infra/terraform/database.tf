# PostgreSQL (RDS) for the control plane. The master password is generated and rotated by RDS in
# Secrets Manager (manage_master_user_password); tasks and hosts read it from there and
# deploy/entrypoint.py assembles DATABASE_URL (URL-encoded, sslmode=require).
resource "aws_db_subnet_group" "main" {
  name_prefix = "${local.name}-"
  description = "Private subnets of ${local.name}"
  subnet_ids  = aws_subnet.private[*].id
}

resource "aws_db_parameter_group" "postgres" {
  name_prefix = "${local.name}-pg16-"
  family      = "postgres16"
  description = "Symphony PostgreSQL: TLS only, statement logging of slow queries"

  parameter {
    name  = "rds.force_ssl"
    value = "1"
  }

  parameter {
    name  = "log_min_duration_statement"
    value = "500"
  }

  parameter {
    name  = "log_statement"
    value = "ddl"
  }

  parameter {
    name  = "log_connections"
    value = "1"
  }

  lifecycle {
    create_before_destroy = true
  }
}

data "aws_iam_policy_document" "rds_monitoring_assume" {
  statement {
    actions = ["sts:AssumeRole"]

    principals {
      type        = "Service"
      identifiers = ["monitoring.rds.amazonaws.com"]
    }
  }
}

resource "aws_iam_role" "rds_monitoring" {
  name_prefix        = "${local.name}-rdsmon-"
  assume_role_policy = data.aws_iam_policy_document.rds_monitoring_assume.json
}

resource "aws_iam_role_policy_attachment" "rds_monitoring" {
  role       = aws_iam_role.rds_monitoring.name
  policy_arn = "arn:${local.partition}:iam::aws:policy/service-role/AmazonRDSEnhancedMonitoringRole"
}

resource "aws_db_instance" "main" {
  identifier_prefix = "${local.name}-"
  engine            = "postgres"
  engine_version    = var.db_engine_version
  instance_class    = var.db_instance_class

  db_name                       = "symphony"
  username                      = "symphony"
  manage_master_user_password   = true
  master_user_secret_kms_key_id = aws_kms_key.main.arn

  allocated_storage     = var.db_allocated_storage_gib
  max_allocated_storage = var.db_allocated_storage_gib * 10
  storage_type          = "gp3"
  storage_encrypted     = true
  kms_key_id            = aws_kms_key.main.arn

  db_subnet_group_name   = aws_db_subnet_group.main.name
  vpc_security_group_ids = [aws_security_group.db.id]
  parameter_group_name   = aws_db_parameter_group.postgres.name
  publicly_accessible    = false
  multi_az               = var.db_multi_az

  backup_retention_period   = var.db_backup_retention_days
  backup_window             = "03:00-04:00"
  maintenance_window        = "sun:04:30-sun:05:30"
  copy_tags_to_snapshot     = true
  delete_automated_backups  = false
  deletion_protection       = var.deletion_protection
  skip_final_snapshot       = false
  final_snapshot_identifier = "${local.name}-final"

  auto_minor_version_upgrade          = true
  iam_database_authentication_enabled = true
  enabled_cloudwatch_logs_exports     = ["postgresql", "upgrade"]
  monitoring_interval                 = 30
  monitoring_role_arn                 = aws_iam_role.rds_monitoring.arn
  performance_insights_enabled        = true
  performance_insights_kms_key_id     = aws_kms_key.main.arn

  depends_on = [aws_iam_role_policy_attachment.rds_monitoring]
}

# --- Redis (ElastiCache): Celery broker/results, event streams run:<id> ----------------------------

resource "aws_elasticache_subnet_group" "main" {
  name       = local.name
  subnet_ids = aws_subnet.private[*].id
}

# The AUTH token is generated once by Secrets Manager and then left alone (ignore_changes): the
# data source yields a new value on every plan.
data "aws_secretsmanager_random_password" "redis" {
  password_length     = 64
  exclude_punctuation = true
}

resource "aws_secretsmanager_secret" "redis_auth" {
  name_prefix = "${local.name}/redis-auth-"
  description = "AUTH token of the ${local.name} ElastiCache replication group"
  kms_key_id  = aws_kms_key.main.arn
  #checkov:skip=CKV2_AWS_57:Rotating the Redis AUTH token needs a coordinated ElastiCache auth_token_update_strategy ROTATE and a restart of every client; done by the runbook in docs/DEPLOY.md, not by a Lambda.
}

resource "aws_secretsmanager_secret_version" "redis_auth" {
  secret_id     = aws_secretsmanager_secret.redis_auth.id
  secret_string = data.aws_secretsmanager_random_password.redis.random_password

  lifecycle {
    ignore_changes = [secret_string]
  }
}

# ElastiCache's default policy (volatile-lru) evicts keys that have a TTL when memory runs out:
# executor and worker heartbeats (the reaper would then fail live runs), run cancellations, stream
# leases and throttle windows (a tenant would get past its caps). noeviction refuses writes
# instead; maxmemory is the node's memory less reserved-memory-percent (docs/DEPLOY.md#redis-memory).
resource "aws_elasticache_parameter_group" "redis" {
  name = "${local.name}-redis"
  # ElastiCache names the families redis6.x, redis7, ...
  family = split(".", var.redis_engine_version)[0] == "6" ? "redis6.x" : "redis${split(".", var.redis_engine_version)[0]}"

  parameter {
    name  = "maxmemory-policy"
    value = "noeviction"
  }

  parameter {
    name  = "reserved-memory-percent"
    value = "25"
  }
}

resource "aws_elasticache_replication_group" "main" {
  replication_group_id = local.name
  description          = "Symphony Celery broker and run event streams"
  engine               = "redis"
  engine_version       = var.redis_engine_version
  node_type            = var.redis_node_type
  port                 = 6379
  parameter_group_name = aws_elasticache_parameter_group.redis.name

  num_cache_clusters         = 2
  automatic_failover_enabled = true
  multi_az_enabled           = true

  subnet_group_name  = aws_elasticache_subnet_group.main.name
  security_group_ids = [aws_security_group.redis.id]

  at_rest_encryption_enabled = true
  kms_key_id                 = aws_kms_key.main.arn
  transit_encryption_enabled = true
  auth_token                 = aws_secretsmanager_secret_version.redis_auth.secret_string

  snapshot_retention_limit   = 7
  snapshot_window            = "02:00-03:00"
  maintenance_window         = "sun:05:30-sun:06:30"
  auto_minor_version_upgrade = true
  apply_immediately          = false

  lifecycle {
    ignore_changes = [auth_token]
  }
}

# --- application secret ------------------------------------------------------------------------------

data "aws_secretsmanager_random_password" "django" {
  password_length = 64
}

resource "aws_secretsmanager_secret" "django" {
  name_prefix = "${local.name}/django-secret-key-"
  description = "DJANGO_SECRET_KEY of ${local.name}"
  kms_key_id  = aws_kms_key.main.arn
  #checkov:skip=CKV2_AWS_57:Rotating DJANGO_SECRET_KEY logs every user out; it is rotated by hand (docs/DEPLOY.md), not by a Lambda.
}

resource "aws_secretsmanager_secret_version" "django" {
  secret_id     = aws_secretsmanager_secret.django.id
  secret_string = data.aws_secretsmanager_random_password.django.random_password

  lifecycle {
    ignore_changes = [secret_string]
  }
}

# --- metrics token: GET /metrics answers only a scraper that sends it (api/metrics_endpoint.py) -------------

data "aws_secretsmanager_random_password" "metrics" {
  password_length     = 48
  exclude_punctuation = true
}

resource "aws_secretsmanager_secret" "metrics" {
  name_prefix = "${local.name}/metrics-token-"
  description = "SYMPHONY_METRICS_TOKEN of ${local.name}: bearer token of the Prometheus scraper"
  kms_key_id  = aws_kms_key.main.arn
  #checkov:skip=CKV2_AWS_57:The scraper's configuration holds this token; it is rotated by hand together with it (docs/DEPLOY.md).
}

resource "aws_secretsmanager_secret_version" "metrics" {
  secret_id     = aws_secretsmanager_secret.metrics.id
  secret_string = data.aws_secretsmanager_random_password.metrics.random_password

  lifecycle {
    ignore_changes = [secret_string]
  }
}

# No ingress from 0.0.0.0/0 except HTTPS on the ALB. GPU hosts and tasks have no inbound ports
# from outside the VPC at all (shell access is through SSM Session Manager).
resource "aws_security_group" "alb" {
  name_prefix = "${local.name}-alb-"
  description = "Public HTTPS load balancer"
  vpc_id      = aws_vpc.main.id

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_security_group" "web" {
  name_prefix = "${local.name}-web-"
  description = "Web (ASGI) tasks behind the ALB"
  vpc_id      = aws_vpc.main.id

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_security_group" "celery" {
  name_prefix = "${local.name}-celery-"
  description = "Control-plane Celery tasks (shared queue, no sandboxes)"
  vpc_id      = aws_vpc.main.id

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_security_group" "gpu" {
  name_prefix = "${local.name}-gpu-"
  description = "GPU hosts: gpu_worker, per-worker Celery, gVisor sandboxes"
  vpc_id      = aws_vpc.main.id

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_security_group" "db" {
  name_prefix = "${local.name}-db-"
  description = "RDS PostgreSQL"
  vpc_id      = aws_vpc.main.id

  lifecycle {
    create_before_destroy = true
  }
}

resource "aws_security_group" "redis" {
  name_prefix = "${local.name}-redis-"
  description = "ElastiCache Redis"
  vpc_id      = aws_vpc.main.id

  lifecycle {
    create_before_destroy = true
  }
}

locals {
  # Every security group that runs Django/Celery code and so talks to PostgreSQL and Redis.
  app_security_groups = {
    web    = aws_security_group.web.id
    celery = aws_security_group.celery.id
    gpu    = aws_security_group.gpu.id
  }
}

# --- ALB -----------------------------------------------------------------------------------------

resource "aws_vpc_security_group_ingress_rule" "alb_https_v4" {
  security_group_id = aws_security_group.alb.id
  description       = "HTTPS from the internet"
  cidr_ipv4         = "0.0.0.0/0"
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443
}

resource "aws_vpc_security_group_egress_rule" "alb_to_web" {
  security_group_id            = aws_security_group.alb.id
  description                  = "ALB to web tasks"
  referenced_security_group_id = aws_security_group.web.id
  ip_protocol                  = "tcp"
  from_port                    = 8000
  to_port                      = 8000
}

resource "aws_vpc_security_group_ingress_rule" "web_from_alb" {
  security_group_id            = aws_security_group.web.id
  description                  = "uvicorn from the ALB only"
  referenced_security_group_id = aws_security_group.alb.id
  ip_protocol                  = "tcp"
  from_port                    = 8000
  to_port                      = 8000
}

# --- application egress: PostgreSQL, Redis, HTTPS (ECR, Secrets Manager, S3, CloudWatch), SMTP ---

resource "aws_vpc_security_group_egress_rule" "app_to_db" {
  for_each = local.app_security_groups

  security_group_id            = each.value
  description                  = "${each.key} to PostgreSQL"
  referenced_security_group_id = aws_security_group.db.id
  ip_protocol                  = "tcp"
  from_port                    = 5432
  to_port                      = 5432
}

resource "aws_vpc_security_group_egress_rule" "app_to_redis" {
  for_each = local.app_security_groups

  security_group_id            = each.value
  description                  = "${each.key} to Redis"
  referenced_security_group_id = aws_security_group.redis.id
  ip_protocol                  = "tcp"
  from_port                    = 6379
  to_port                      = 6379
}

resource "aws_vpc_security_group_egress_rule" "app_https" {
  for_each = local.app_security_groups

  security_group_id = each.value
  description       = "${each.key} to AWS APIs and registries over HTTPS (via NAT / S3 endpoint)"
  cidr_ipv4         = "0.0.0.0/0"
  ip_protocol       = "tcp"
  from_port         = 443
  to_port           = 443
}

# Only control-plane Celery sends mail (mail.tf): SMTP with STARTTLS to the regional Amazon SES
# endpoint, through the NAT gateways (SES publishes no fixed address range to narrow this to).
resource "aws_vpc_security_group_egress_rule" "celery_smtp" {
  security_group_id = aws_security_group.celery.id
  description       = "celery to the Amazon SES SMTP endpoint (STARTTLS, port 587)"
  cidr_ipv4         = "0.0.0.0/0"
  ip_protocol       = "tcp"
  from_port         = 587
  to_port           = 587
}

# Brokered I/O (http_fetch) is performed by gpu_worker against a per-tenant allowlist; plain HTTP
# targets need port 80. Sandboxes themselves have no network (runsc --network=none).
resource "aws_vpc_security_group_egress_rule" "gpu_http" {
  security_group_id = aws_security_group.gpu.id
  description       = "gpu_worker brokered http_fetch and apt (plain HTTP)"
  cidr_ipv4         = "0.0.0.0/0"
  ip_protocol       = "tcp"
  from_port         = 80
  to_port           = 80
}

# --- data stores: ingress only from the application groups ----------------------------------------

resource "aws_vpc_security_group_ingress_rule" "db_from_app" {
  for_each = local.app_security_groups

  security_group_id            = aws_security_group.db.id
  description                  = "PostgreSQL from ${each.key}"
  referenced_security_group_id = each.value
  ip_protocol                  = "tcp"
  from_port                    = 5432
  to_port                      = 5432
}

resource "aws_vpc_security_group_ingress_rule" "redis_from_app" {
  for_each = local.app_security_groups

  security_group_id            = aws_security_group.redis.id
  description                  = "Redis from ${each.key}"
  referenced_security_group_id = each.value
  ip_protocol                  = "tcp"
  from_port                    = 6379
  to_port                      = 6379
}

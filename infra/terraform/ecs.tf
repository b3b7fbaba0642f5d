# Control plane on ECS Fargate: web (uvicorn ASGI) behind the ALB, a one-off migrate task, and
# Celery consuming the shared "symphony" queue. The Celery workers that start sandboxes
# (queue worker.<name>) run on the GPU hosts next to their gpu_worker (gpu.tf): they need the
# host's dockerd with runsc and the worker's session sockets, which Fargate cannot offer.
resource "aws_ecs_cluster" "main" {
  name = local.name

  setting {
    name  = "containerInsights"
    value = "enabled"
  }
}

resource "aws_cloudwatch_log_group" "ecs" {
  name              = "/symphony/${var.environment}/ecs"
  retention_in_days = var.log_retention_days
  kms_key_id        = aws_kms_key.main.arn
}

locals {
  # Plain settings; deploy/entrypoint.py turns DATABASE_* and REDIS_* into the URLs Django and
  # Celery read (DATABASE_URL, REDIS_URL, CELERY_BROKER_URL, CELERY_RESULT_BACKEND).
  app_environment = {
    DJANGO_DEBUG                = "0"
    DJANGO_ALLOWED_HOSTS        = join(",", concat([var.domain_name], var.django_allowed_hosts))
    DJANGO_CSRF_TRUSTED_ORIGINS = "https://${var.domain_name}"
    # The ALB only listens on 443, so there is no plain-HTTP request to redirect.
    DJANGO_SECURE_SSL_REDIRECT = "0"
    DATABASE_HOST              = aws_db_instance.main.address
    DATABASE_PORT              = tostring(aws_db_instance.main.port)
    DATABASE_NAME              = aws_db_instance.main.db_name
    DATABASE_USER              = aws_db_instance.main.username
    DATABASE_SSLMODE           = "require"
    REDIS_HOST                 = aws_elasticache_replication_group.main.primary_endpoint_address
    REDIS_PORT                 = "6379"
    REDIS_TLS                  = "1"
    SYMPHONY_SANDBOX_IMAGE     = var.sandbox_image
    # Only the ALB's X-Forwarded-For is believed (its nodes live in the public subnets); Django
    # picks the right-most address the ALB did not vouch for (api/client_address.py), and uvicorn
    # runs with --no-proxy-headers so it never believes one on its own.
    SYMPHONY_TRUSTED_PROXIES = join(",", aws_subnet.public[*].cidr_block)
    # Mail (mail.tf): links point at the console behind the ALB; SES sends as this address.
    SYMPHONY_PUBLIC_URL = "https://${var.domain_name}"
    SYMPHONY_EMAIL_FROM = "Symphony <${local.mail_from_address}>"
    LOG_LEVEL           = "INFO"
  }

  app_secrets = [
    { name = "DJANGO_SECRET_KEY", valueFrom = aws_secretsmanager_secret.django.arn },
    { name = "DATABASE_PASSWORD", valueFrom = "${aws_db_instance.main.master_user_secret[0].secret_arn}:password::" },
    { name = "REDIS_AUTH_TOKEN", valueFrom = aws_secretsmanager_secret.redis_auth.arn },
    { name = "SYMPHONY_METRICS_TOKEN", valueFrom = aws_secretsmanager_secret.metrics.arn },
    # The version's arn is the secret's: referencing it makes tasks wait until the value exists.
    { name = "SYMPHONY_EMAIL_URL", valueFrom = aws_secretsmanager_secret_version.email_url.arn },
  ]

  app_container = {
    image                  = local.web_image
    essential              = true
    readonlyRootFilesystem = true
    user                   = "10001:10001"
    environment            = [for k, v in local.app_environment : { name = k, value = v }]
    secrets                = local.app_secrets
    mountPoints            = [{ sourceVolume = "tmp", containerPath = "/tmp", readOnly = false }]
    linuxParameters        = { initProcessEnabled = true, capabilities = { drop = ["ALL"] } }
  }
}

resource "aws_ecs_task_definition" "web" {
  family                   = "${local.name}-web"
  requires_compatibilities = ["FARGATE"]
  network_mode             = "awsvpc"
  cpu                      = var.web_cpu
  memory                   = var.web_memory
  execution_role_arn       = aws_iam_role.ecs_execution.arn
  task_role_arn            = aws_iam_role.ecs_task.arn

  volume {
    name = "tmp"
  }

  container_definitions = jsonencode([merge(local.app_container, {
    name         = "web"
    command      = ["python", "-m", "uvicorn", "web.asgi:application", "--host", "0.0.0.0", "--port", "8000", "--no-proxy-headers"]
    portMappings = [{ containerPort = 8000, protocol = "tcp" }]
    healthCheck = {
      command     = ["CMD", "python", "/app/deploy/healthcheck.py", "web"]
      interval    = 15
      timeout     = 10
      retries     = 3
      startPeriod = 30
    }
    logConfiguration = {
      logDriver = "awslogs"
      options = {
        awslogs-group         = aws_cloudwatch_log_group.ecs.name
        awslogs-region        = var.region
        awslogs-stream-prefix = "web"
      }
    }
  })])
}

# Run once per release before updating the services:
#   aws ecs run-task --cluster <cluster> --task-definition <migrate family> --launch-type FARGATE \
#     --network-configuration 'awsvpcConfiguration={subnets=[<private>],securityGroups=[<celery sg>]}'
resource "aws_ecs_task_definition" "migrate" {
  family                   = "${local.name}-migrate"
  requires_compatibilities = ["FARGATE"]
  network_mode             = "awsvpc"
  cpu                      = 512
  memory                   = 1024
  execution_role_arn       = aws_iam_role.ecs_execution.arn
  task_role_arn            = aws_iam_role.ecs_task.arn

  volume {
    name = "tmp"
  }

  container_definitions = jsonencode([merge(local.app_container, {
    name    = "migrate"
    command = ["python", "manage.py", "migrate", "--noinput"]
    logConfiguration = {
      logDriver = "awslogs"
      options = {
        awslogs-group         = aws_cloudwatch_log_group.ecs.name
        awslogs-region        = var.region
        awslogs-stream-prefix = "migrate"
      }
    }
  })])
}

resource "aws_ecs_task_definition" "celery" {
  family                   = "${local.name}-celery"
  requires_compatibilities = ["FARGATE"]
  network_mode             = "awsvpc"
  cpu                      = 512
  memory                   = 1024
  execution_role_arn       = aws_iam_role.ecs_execution.arn
  task_role_arn            = aws_iam_role.ecs_task.arn

  volume {
    name = "tmp"
  }

  container_definitions = jsonencode([merge(local.app_container, {
    name    = "celery"
    command = ["python", "-m", "celery", "-A", "web", "worker", "--loglevel=INFO", "-Q", "symphony", "--hostname", "celery-control@%h", "--concurrency", "4"]
    logConfiguration = {
      logDriver = "awslogs"
      options = {
        awslogs-group         = aws_cloudwatch_log_group.ecs.name
        awslogs-region        = var.region
        awslogs-stream-prefix = "celery"
      }
    }
  })])
}

resource "aws_ecs_service" "web" {
  name                   = "web"
  cluster                = aws_ecs_cluster.main.id
  task_definition        = aws_ecs_task_definition.web.arn
  desired_count          = var.web_count
  launch_type            = "FARGATE"
  propagate_tags         = "SERVICE"
  enable_execute_command = false

  network_configuration {
    subnets          = aws_subnet.private[*].id
    security_groups  = [aws_security_group.web.id]
    assign_public_ip = false
  }

  load_balancer {
    target_group_arn = aws_lb_target_group.web.arn
    container_name   = "web"
    container_port   = 8000
  }

  deployment_circuit_breaker {
    enable   = true
    rollback = true
  }

  depends_on = [aws_lb_listener_rule.web]
}

resource "aws_ecs_service" "celery" {
  name                   = "celery"
  cluster                = aws_ecs_cluster.main.id
  task_definition        = aws_ecs_task_definition.celery.arn
  desired_count          = var.celery_count
  launch_type            = "FARGATE"
  propagate_tags         = "SERVICE"
  enable_execute_command = false

  network_configuration {
    subnets          = aws_subnet.private[*].id
    security_groups  = [aws_security_group.celery.id]
    assign_public_ip = false
  }

  deployment_circuit_breaker {
    enable   = true
    rollback = true
  }
}

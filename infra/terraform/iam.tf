# Least privilege: each role reads exactly the secrets and writes exactly the log groups it uses;
# only the GPU host role touches the KV bucket, and only below the "kv/" prefix.

data "aws_iam_policy_document" "ecs_tasks_assume" {
  statement {
    actions = ["sts:AssumeRole"]

    principals {
      type        = "Service"
      identifiers = ["ecs-tasks.amazonaws.com"]
    }

    condition {
      test     = "StringEquals"
      variable = "aws:SourceAccount"
      values   = [local.account_id]
    }
  }
}

locals {
  app_secret_arns = [
    aws_secretsmanager_secret.django.arn,
    aws_secretsmanager_secret.redis_auth.arn,
    aws_secretsmanager_secret.metrics.arn,
    aws_db_instance.main.master_user_secret[0].secret_arn,
  ]
}

# --- ECS task execution role: pull images, write logs, inject secrets ------------------------------

resource "aws_iam_role" "ecs_execution" {
  name_prefix        = "${local.name}-ecs-exec-"
  assume_role_policy = data.aws_iam_policy_document.ecs_tasks_assume.json
}

data "aws_iam_policy_document" "ecs_execution" {
  statement {
    sid       = "EcrAuth"
    actions   = ["ecr:GetAuthorizationToken"]
    resources = ["*"] # GetAuthorizationToken has no resource-level permissions.
  }

  statement {
    sid       = "EcrPull"
    actions   = ["ecr:BatchCheckLayerAvailability", "ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"]
    resources = [aws_ecr_repository.this["web"].arn]
  }

  statement {
    sid       = "Logs"
    actions   = ["logs:CreateLogStream", "logs:PutLogEvents"]
    resources = ["${aws_cloudwatch_log_group.ecs.arn}:*"]
  }

  # SYMPHONY_EMAIL_URL (SES SMTP credentials) goes to the ECS tasks only: the GPU hosts do not
  # consume the queue the mail tasks run on (mail.tf).
  statement {
    sid       = "Secrets"
    actions   = ["secretsmanager:GetSecretValue"]
    resources = concat(local.app_secret_arns, [aws_secretsmanager_secret.email_url.arn])
  }

  statement {
    sid       = "DecryptSecrets"
    actions   = ["kms:Decrypt"]
    resources = [aws_kms_key.main.arn]

    condition {
      test     = "StringEquals"
      variable = "kms:ViaService"
      values   = ["secretsmanager.${var.region}.amazonaws.com", "ecr.${var.region}.amazonaws.com"]
    }
  }
}

resource "aws_iam_role_policy" "ecs_execution" {
  name   = "pull-log-secrets"
  role   = aws_iam_role.ecs_execution.id
  policy = data.aws_iam_policy_document.ecs_execution.json
}

# Runtime role of web and control-plane Celery tasks: they need no AWS API at all (PostgreSQL and
# Redis are reached over the network with credentials injected at start).
resource "aws_iam_role" "ecs_task" {
  name_prefix        = "${local.name}-ecs-task-"
  assume_role_policy = data.aws_iam_policy_document.ecs_tasks_assume.json
}

# --- GPU host role ------------------------------------------------------------------------------------

data "aws_iam_policy_document" "ec2_assume" {
  statement {
    actions = ["sts:AssumeRole"]

    principals {
      type        = "Service"
      identifiers = ["ec2.amazonaws.com"]
    }
  }
}

resource "aws_iam_role" "gpu" {
  name_prefix        = "${local.name}-gpu-"
  assume_role_policy = data.aws_iam_policy_document.ec2_assume.json
}

data "aws_iam_policy_document" "gpu" {
  statement {
    sid       = "KvObjects"
    actions   = ["s3:GetObject", "s3:PutObject", "s3:DeleteObject"]
    resources = ["${aws_s3_bucket.kv.arn}/${local.kv_prefix}/*"]
  }

  statement {
    sid       = "KvList"
    actions   = ["s3:ListBucket"]
    resources = [aws_s3_bucket.kv.arn]

    condition {
      test     = "StringLike"
      variable = "s3:prefix"
      values   = ["${local.kv_prefix}/*"]
    }
  }

  statement {
    sid       = "KvEncryption"
    actions   = ["kms:Decrypt", "kms:GenerateDataKey"]
    resources = [aws_kms_key.main.arn]

    condition {
      test     = "StringEquals"
      variable = "kms:ViaService"
      values   = ["s3.${var.region}.amazonaws.com", "secretsmanager.${var.region}.amazonaws.com", "ecr.${var.region}.amazonaws.com"]
    }
  }

  statement {
    sid       = "EcrAuth"
    actions   = ["ecr:GetAuthorizationToken"]
    resources = ["*"] # GetAuthorizationToken has no resource-level permissions.
  }

  statement {
    sid       = "EcrPull"
    actions   = ["ecr:BatchCheckLayerAvailability", "ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"]
    resources = [for repo in aws_ecr_repository.this : repo.arn]
  }

  statement {
    sid       = "Secrets"
    actions   = ["secretsmanager:GetSecretValue"]
    resources = local.app_secret_arns
  }

  statement {
    sid       = "Logs"
    actions   = ["logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"]
    resources = ["${aws_cloudwatch_log_group.gpu.arn}:*"]
  }
}

resource "aws_iam_role_policy" "gpu" {
  name   = "kv-prefix-images-secrets-logs"
  role   = aws_iam_role.gpu.id
  policy = data.aws_iam_policy_document.gpu.json
}

# Shell access through SSM Session Manager instead of SSH (no inbound port, audited sessions).
resource "aws_iam_role_policy_attachment" "gpu_ssm" {
  role       = aws_iam_role.gpu.name
  policy_arn = "arn:${local.partition}:iam::aws:policy/AmazonSSMManagedInstanceCore"
}

resource "aws_iam_instance_profile" "gpu" {
  name_prefix = "${local.name}-gpu-"
  role        = aws_iam_role.gpu.name
}

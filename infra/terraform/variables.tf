variable "region" {
  description = "AWS region to deploy into."
  type        = string
  default     = "us-east-1"

  validation {
    condition     = can(regex("^[a-z]{2}(-gov)?-[a-z]+-[0-9]$", var.region))
    error_message = "The region must look like an AWS region name, e.g. us-east-1."
  }
}

variable "environment" {
  description = "Deployment name (prod, staging, ...); part of every resource name."
  type        = string
  default     = "prod"

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{1,15}$", var.environment))
    error_message = "The environment must be 2-16 lowercase letters, digits or dashes, starting with a letter."
  }
}

variable "tags" {
  description = "Extra tags applied to every resource."
  type        = map(string)
  default     = {}
}

# --- network -----------------------------------------------------------------------------------

variable "vpc_cidr" {
  description = "CIDR block of the VPC; split into public and private /20 subnets per AZ."
  type        = string
  default     = "10.40.0.0/16"

  validation {
    condition     = can(cidrnetmask(var.vpc_cidr)) && tonumber(split("/", var.vpc_cidr)[1]) <= 18
    error_message = "The vpc_cidr must be a valid IPv4 CIDR of size /18 or larger."
  }
}

variable "az_count" {
  description = "Number of availability zones to spread subnets (and the NAT gateways) over."
  type        = number
  default     = 2

  validation {
    condition     = var.az_count >= 2 && var.az_count <= 4
    error_message = "The az_count must be between 2 and 4 (RDS and the ALB need at least two AZs)."
  }
}

variable "single_nat_gateway" {
  description = "Use one NAT gateway for all private subnets (cheaper, but an AZ outage cuts egress)."
  type        = bool
  default     = false
}

# --- TLS / DNS -----------------------------------------------------------------------------------

variable "certificate_arn" {
  description = "ARN of the ACM certificate served by the HTTPS listener of the ALB."
  type        = string

  validation {
    condition     = can(regex("^arn:aws[a-z-]*:acm:[a-z0-9-]+:[0-9]{12}:certificate/.+$", var.certificate_arn))
    error_message = "The certificate_arn must be an ACM certificate ARN."
  }
}

variable "domain_name" {
  description = "Public host name of the service (must match the certificate); the ALB forwards only this Host."
  type        = string

  validation {
    condition     = can(regex("^[a-z0-9]([a-z0-9.-]*[a-z0-9])?$", var.domain_name))
    error_message = "The domain_name must be a lowercase DNS name."
  }
}

# --- mail (Amazon SES, mail.tf) ---------------------------------------------------------------------

variable "mail_domain" {
  description = "Domain the service sends mail from, verified in Amazon SES with Easy DKIM (publish the CNAMEs of output mail_dns_records); empty means domain_name. SES starts in sandbox mode (mail only to verified addresses): request production access in the SES console before going live."
  type        = string
  default     = ""

  validation {
    condition     = var.mail_domain == "" || can(regex("^[a-z0-9]([a-z0-9-]*[a-z0-9])?(\\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)+$", var.mail_domain))
    error_message = "The mail_domain must be empty or a lowercase DNS domain name such as example.com."
  }
}

variable "mail_from_address" {
  description = "Sender address of every mail (SYMPHONY_EMAIL_FROM, display name Symphony); must be an address at mail_domain. Empty means noreply@<mail_domain>."
  type        = string
  default     = ""

  validation {
    condition     = var.mail_from_address == "" || can(regex("^[A-Za-z0-9._%+-]+@[a-z0-9]([a-z0-9.-]*[a-z0-9])?$", var.mail_from_address))
    error_message = "The mail_from_address must be empty or a plain address like noreply@example.com (no display name)."
  }
}

variable "mail_sandbox_recipients" {
  description = "While SES is in sandbox mode, the only addresses mail reaches: each becomes an SES identity (SES mails it a confirmation link) that the SMTP user may send to. Empty it once production access is granted."
  type        = list(string)
  default     = []

  validation {
    condition     = alltrue([for a in var.mail_sandbox_recipients : can(regex("^[^@\\s]+@[^@\\s]+\\.[^@\\s]+$", a))])
    error_message = "Every mail_sandbox_recipients entry must be an email address."
  }
}

# --- images ------------------------------------------------------------------------------------

variable "image_tag" {
  description = "Tag of the images in the ECR repositories created here (immutable tags: use a release or git sha)."
  type        = string
  default     = "v1"

  validation {
    condition     = can(regex("^[A-Za-z0-9_.-]{1,100}$", var.image_tag)) && var.image_tag != "latest"
    error_message = "The image_tag must be a valid, immutable docker tag (not 'latest')."
  }
}

variable "web_image" {
  description = "Full control-plane image reference; empty means <ECR web repo>:<image_tag>."
  type        = string
  default     = ""
}

variable "worker_image" {
  description = "Full CUDA worker image reference; empty means <ECR worker repo>:<image_tag>-cuda."
  type        = string
  default     = ""
}

variable "sandbox_image" {
  description = "Docker image the Celery executor runs LIPs in (runtime runsc). Empty: built on each GPU host at boot."
  type        = string
  default     = ""
}

# --- control plane (ECS Fargate) ------------------------------------------------------------------

variable "web_count" {
  description = "Number of web (uvicorn ASGI) tasks."
  type        = number
  default     = 2

  validation {
    condition     = var.web_count >= 1 && var.web_count <= 50
    error_message = "The web_count must be between 1 and 50."
  }
}

variable "web_cpu" {
  description = "Fargate CPU units per web task (1024 = 1 vCPU)."
  type        = number
  default     = 1024

  validation {
    condition     = contains([256, 512, 1024, 2048, 4096], var.web_cpu)
    error_message = "The web_cpu must be a Fargate CPU size: 256, 512, 1024, 2048 or 4096."
  }
}

variable "web_memory" {
  description = "Fargate memory (MiB) per web task."
  type        = number
  default     = 2048

  validation {
    condition     = var.web_memory >= 512 && var.web_memory <= 30720
    error_message = "The web_memory must be between 512 and 30720 MiB."
  }
}

variable "celery_count" {
  description = "Number of control-plane Celery tasks consuming the shared 'symphony' queue (no sandboxes). They alone send mail: with 0, password-reset and invitation mails wait in Redis."
  type        = number
  default     = 1

  validation {
    condition     = var.celery_count >= 0 && var.celery_count <= 20
    error_message = "The celery_count must be between 0 and 20."
  }
}

variable "django_allowed_hosts" {
  description = "Extra DJANGO_ALLOWED_HOSTS entries besides domain_name."
  type        = list(string)
  default     = []
}

# --- GPU hosts -------------------------------------------------------------------------------------

variable "gpu_instance_type" {
  description = "EC2 instance type of the GPU hosts (one gpu_worker + one Celery worker per GPU)."
  type        = string
  default     = "g5.xlarge"

  validation {
    condition     = can(regex("^(g4dn|g5|g5g|g6|g6e|gr6|p3|p4d|p4de|p5|p5e)\\.[0-9a-z]+$", var.gpu_instance_type))
    error_message = "The gpu_instance_type must be an NVIDIA GPU instance type (g4dn, g5, g6, g6e, p3, p4d, p5, ...)."
  }
}

variable "gpu_ami_id" {
  description = "AMI of the GPU hosts; empty selects the latest AWS Deep Learning Base GPU AMI (Ubuntu 22.04: NVIDIA driver, docker, nvidia-container-toolkit)."
  type        = string
  default     = ""
}

variable "gpu_min_size" {
  description = "Minimum number of GPU hosts."
  type        = number
  default     = 1

  validation {
    condition     = var.gpu_min_size >= 0
    error_message = "The gpu_min_size must not be negative."
  }
}

variable "gpu_max_size" {
  description = "Maximum number of GPU hosts."
  type        = number
  default     = 4

  validation {
    condition     = var.gpu_max_size >= 1 && var.gpu_max_size <= 100
    error_message = "The gpu_max_size must be between 1 and 100."
  }
}

variable "gpu_desired_capacity" {
  description = "Desired number of GPU hosts (scale out by raising it; each host serves every GPU it has)."
  type        = number
  default     = 1
}

variable "gpu_root_volume_gib" {
  description = "Size of the encrypted gp3 root volume of a GPU host (images, model weights, KV spill)."
  type        = number
  default     = 200

  validation {
    condition     = var.gpu_root_volume_gib >= 100
    error_message = "The gpu_root_volume_gib must be at least 100 GiB (CUDA images and model weights)."
  }
}

variable "model_id" {
  description = "Model served by every gpu_worker: a Hugging Face repo id fetched at boot, or an absolute path baked into the AMI. Empty serves the bundled SmolLM2-135M."
  type        = string
  default     = ""
}

variable "kv_cache_gib" {
  description = "Device memory per GPU reserved for KV pages (SYMPHONY_KV_CACHE_GIB)."
  type        = number
  default     = 16

  validation {
    condition     = var.kv_cache_gib > 0
    error_message = "The kv_cache_gib must be positive."
  }
}

variable "gvisor_release" {
  description = "gVisor apt release installed on the GPU hosts ('release' for the latest, or a dated release like '20250512')."
  type        = string
  default     = "release"

  validation {
    condition     = can(regex("^(release|[0-9]{8}(\\.[0-9]+)?)$", var.gvisor_release))
    error_message = "The gvisor_release must be 'release' or a dated release such as 20250512."
  }
}

variable "celery_concurrency" {
  description = "Concurrent runs (sandboxes) per GPU worker's Celery process."
  type        = number
  default     = 16

  validation {
    condition     = var.celery_concurrency >= 1 && var.celery_concurrency <= 256
    error_message = "The celery_concurrency must be between 1 and 256."
  }
}

# --- data stores ---------------------------------------------------------------------------------

variable "db_instance_class" {
  description = "RDS PostgreSQL instance class."
  type        = string
  default     = "db.t4g.medium"

  validation {
    condition     = can(regex("^db\\.", var.db_instance_class))
    error_message = "The db_instance_class must be an RDS instance class (db.*)."
  }
}

variable "db_engine_version" {
  description = "RDS PostgreSQL major.minor version."
  type        = string
  default     = "16.4"
}

variable "db_allocated_storage_gib" {
  description = "Initial RDS storage (GiB); autoscaling grows it up to 10x."
  type        = number
  default     = 50

  validation {
    condition     = var.db_allocated_storage_gib >= 20
    error_message = "The db_allocated_storage_gib must be at least 20."
  }
}

variable "db_multi_az" {
  description = "Run RDS with a synchronous standby in a second AZ."
  type        = bool
  default     = true
}

variable "db_backup_retention_days" {
  description = "Days of automated RDS backups (point-in-time recovery window)."
  type        = number
  default     = 14

  validation {
    condition     = var.db_backup_retention_days >= 7 && var.db_backup_retention_days <= 35
    error_message = "The db_backup_retention_days must be between 7 and 35."
  }
}

variable "redis_node_type" {
  description = "ElastiCache node type."
  type        = string
  default     = "cache.t4g.medium"

  validation {
    condition     = can(regex("^cache\\.", var.redis_node_type))
    error_message = "The redis_node_type must be an ElastiCache node type (cache.*)."
  }
}

variable "redis_engine_version" {
  description = "ElastiCache Redis OSS engine version."
  type        = string
  default     = "7.1"
}

# --- KV store bucket -----------------------------------------------------------------------------

variable "kv_ia_transition_days" {
  description = "Days after which spilled KV files move to S3 Standard-IA."
  type        = number
  default     = 30

  validation {
    condition     = var.kv_ia_transition_days >= 30
    error_message = "S3 requires at least 30 days before a transition to STANDARD_IA."
  }
}

variable "kv_expiration_days" {
  description = "Days after which a persistent KV file not rewritten is deleted (0 disables expiry)."
  type        = number
  default     = 180

  validation {
    condition     = var.kv_expiration_days == 0 || var.kv_expiration_days > 30
    error_message = "The kv_expiration_days must be 0 (never) or more than 30 (after the IA transition)."
  }
}

variable "kv_noncurrent_version_days" {
  description = "Days an overwritten or deleted KV file version is kept (undo window)."
  type        = number
  default     = 7

  validation {
    condition     = var.kv_noncurrent_version_days >= 1
    error_message = "The kv_noncurrent_version_days must be at least 1."
  }
}

variable "log_retention_days" {
  description = "CloudWatch Logs retention for every log group."
  type        = number
  default     = 365

  validation {
    condition     = contains([365, 400, 545, 731, 1096, 1827, 2192, 2557, 2922, 3288, 3653], var.log_retention_days)
    error_message = "The log_retention_days must be a CloudWatch retention value of at least 365."
  }
}

variable "deletion_protection" {
  description = "Protect RDS and the ALB against deletion (turn off only to destroy a test stack)."
  type        = bool
  default     = true
}

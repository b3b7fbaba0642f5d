output "alb_dns_name" {
  description = "DNS name of the ALB; point domain_name at it (CNAME or Route 53 alias)."
  value       = aws_lb.main.dns_name
}

output "alb_zone_id" {
  description = "Hosted zone id of the ALB, for a Route 53 alias record."
  value       = aws_lb.main.zone_id
}

output "vpc_id" {
  description = "VPC id."
  value       = aws_vpc.main.id
}

output "private_subnet_ids" {
  description = "Private subnets (ECS tasks, GPU hosts, data stores)."
  value       = aws_subnet.private[*].id
}

output "ecs_cluster_name" {
  description = "ECS cluster running web and control-plane Celery."
  value       = aws_ecs_cluster.main.name
}

output "migrate_task_definition" {
  description = "Task definition to run once per release (aws ecs run-task) before updating services."
  value       = aws_ecs_task_definition.migrate.arn
}

output "migrate_security_group_id" {
  description = "Security group to run the migrate task with."
  value       = aws_security_group.celery.id
}

output "ecr_repository_urls" {
  description = "ECR repositories to push the web and worker images to."
  value       = { for k, repo in aws_ecr_repository.this : k => repo.repository_url }
}

output "kv_bucket" {
  description = "S3 bucket holding persistent KV files (SYMPHONY_KV_STORE=s3://<bucket>/kv)."
  value       = aws_s3_bucket.kv.id
}

output "kv_store_url" {
  description = "Value of SYMPHONY_KV_STORE on the GPU hosts."
  value       = "s3://${aws_s3_bucket.kv.id}/${local.kv_prefix}"
}

output "db_endpoint" {
  description = "RDS PostgreSQL endpoint (private)."
  value       = aws_db_instance.main.endpoint
}

output "db_master_secret_arn" {
  description = "Secrets Manager secret with the RDS master credentials (managed and rotated by RDS)."
  value       = aws_db_instance.main.master_user_secret[0].secret_arn
}

output "redis_endpoint" {
  description = "ElastiCache primary endpoint (TLS, AUTH token in Secrets Manager)."
  value       = aws_elasticache_replication_group.main.primary_endpoint_address
}

output "gpu_autoscaling_group" {
  description = "Auto Scaling group of the GPU hosts; scale out by raising its desired capacity."
  value       = aws_autoscaling_group.gpu.name
}

output "kms_key_arn" {
  description = "Customer-managed KMS key encrypting every store."
  value       = aws_kms_key.main.arn
}

output "metrics_token_secret_arn" {
  description = "Secrets Manager secret with the bearer token for GET /metrics (give it to the Prometheus scraper)."
  value       = aws_secretsmanager_secret.metrics.arn
}

output "mail_dns_records" {
  description = "DNS records to publish for mail_domain (this module manages no DNS zone): the Easy DKIM CNAMEs that verify the SES identity and sign every mail. SES starts in sandbox mode (mail only to verified addresses): request production access in the SES console before going live."
  value       = local.mail_dkim_records
}

output "mail_dkim_tokens" {
  description = "The three Easy DKIM tokens of the SES identity (each <token>._domainkey.<mail_domain> CNAME <token>.dkim.amazonses.com)."
  value       = aws_sesv2_email_identity.mail.dkim_signing_attributes[0].tokens
}

output "mail_verified_for_sending" {
  description = "Whether SES has seen the DKIM records and lets the identity send (as of this apply or refresh)."
  value       = aws_sesv2_email_identity.mail.verified_for_sending_status
}

output "mail_from" {
  description = "SYMPHONY_EMAIL_FROM of the ECS tasks."
  value       = local.app_environment.SYMPHONY_EMAIL_FROM
}

output "mail_smtp_secret_arn" {
  description = "Secrets Manager secret holding SYMPHONY_EMAIL_URL (SES SMTP endpoint and the credentials of the send-only IAM user)."
  value       = aws_secretsmanager_secret.email_url.arn
}

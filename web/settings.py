"""Settings of the control plane, read from environment variables with local defaults.

Every knob an operator may turn is an environment variable; the defaults run the stack on one
machine against PostgreSQL and Redis on 127.0.0.1 (see README "Configuration").
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import dj_database_url

from web.inflight_limit import default_total_limit

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(os.environ.get("SYMPHONY_VAR_DIR", BASE_DIR / "var"))


def env_bool(name: str, default: bool) -> bool:
    value = os.environ.get(name)
    if value is None:
        return default
    return value.strip().lower() in {"1", "true", "yes", "on"}


def env_list(name: str, default: str) -> list[str]:
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


DEBUG = env_bool("DJANGO_DEBUG", True)
SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "dev-only-insecure-key-change-me" if DEBUG else "")
if not SECRET_KEY:
    raise RuntimeError("DJANGO_SECRET_KEY must be set when DJANGO_DEBUG is off")
#: Earlier SECRET_KEYs, newest first, during a rotation: sessions, API keys and invitation links
#: made under them still verify (API keys are re-hashed under SECRET_KEY when next used).
SECRET_KEY_FALLBACKS = env_list("DJANGO_SECRET_KEY_FALLBACKS", "")
ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", "127.0.0.1,localhost,testserver")
CSRF_TRUSTED_ORIGINS = env_list("DJANGO_CSRF_TRUSTED_ORIGINS", "http://127.0.0.1:8000,http://localhost:8000")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Swagger UI's files, served from here: an offline deployment has no CDN
    "api",
]

MIDDLEWARE = [
    # First: every response gets a policy, those of the probes below answered early included.
    "web.csp.content_security_policy",  # per page kind: console, admin, Swagger UI (web/csp.py)
    "api.client_address.client_address_middleware",  # REMOTE_ADDR = the client, before anything reads it
    "api.health.HealthProbeMiddleware",  # before host validation and HTTPS redirect (LB probes)
    "api.metrics_endpoint.MetricsEndpointMiddleware",  # the same for Prometheus scrapers (token-guarded)
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "api.throttling.rate_limit_headers",  # RateLimit-* of the tenant's request rate
    "api.db_admission.release_db_share",  # a request's place in its account's database share, given back
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last, so it sees a view's exception first: the API's envelope even with DJANGO_DEBUG on.
    "web.api_errors.ApiErrorsMiddleware",
]

ROOT_URLCONF = "web.urls"
ASGI_APPLICATION = "web.asgi.application"
WSGI_APPLICATION = "web.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {
    "default": dj_database_url.parse(
        os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/symphony"),
        conn_max_age=int(os.environ.get("DATABASE_CONN_MAX_AGE", "60")),
        conn_health_checks=True,
    )
}
#: psycopg's connection pool, at most this many connections per process (0: no pool). The web
#: process turns it on (web/asgi.py): under ASGI every request runs on a thread of its own, so
#: without a pool each request opened a connection (several ms) and closed it again. A closed
#: connection goes back to the pool; past the bound a call waits up to
#: ``DATABASE_POOL_TIMEOUT_S`` for one, then fails as a database outage does (a 503).
DATABASE_POOL_MAX_SIZE = int(os.environ.get("DATABASE_POOL_MAX_SIZE", "0"))
DATABASE_POOL_TIMEOUT_S = float(os.environ.get("DATABASE_POOL_TIMEOUT_S", "10"))
if DATABASE_POOL_MAX_SIZE > 0:
    DATABASES["default"]["CONN_MAX_AGE"] = 0  # the pool keeps them instead
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
        "min_size": 1,
        "max_size": DATABASE_POOL_MAX_SIZE,
        "timeout": DATABASE_POOL_TIMEOUT_S,
        "max_idle": 60,  # an idle connection past min_size is closed after a minute
        "name": "web",
    }
#: What the deploy runs against this database, for ``manage.py check --deploy`` (api/checks.py,
#: ``api.E102``): its web processes (all hosts together), each with a pool of
#: ``DATABASE_POOL_MAX_SIZE``, and the connections everything else may hold at once (Celery
#: executors and their run threads, beat, migrations, an operator's shell). Together they must
#: fit in PostgreSQL's ``max_connections``.
SYMPHONY_WEB_PROCESSES = int(os.environ.get("SYMPHONY_WEB_PROCESSES", "1"))
SYMPHONY_OTHER_DB_CONNECTIONS = int(os.environ.get("SYMPHONY_OTHER_DB_CONNECTIONS", "24"))
# One test database per checkout, so two checkouts on one machine (a CI clone next to a working
# tree) never collide on pytest-django's "test_<name>" database.
DATABASES["default"]["TEST"] = {
    "NAME": f"test_{DATABASES['default']['NAME']}_{hashlib.sha256(str(BASE_DIR).encode()).hexdigest()[:8]}"
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = VAR_DIR / "staticfiles"
FRONTEND_DIST = BASE_DIR / "frontend" / "dist"
STATICFILES_DIRS = [FRONTEND_DIST] if FRONTEND_DIST.is_dir() else []

# --- Redis / Celery -----------------------------------------------------------------------
REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
CELERY_BROKER_URL = os.environ.get("CELERY_BROKER_URL", "redis://127.0.0.1:6379/1")
CELERY_RESULT_BACKEND = os.environ.get("CELERY_RESULT_BACKEND", "redis://127.0.0.1:6379/2")
#: Shared cache (throttle counters, the API-key brute-force guard): Redis, so every web process
#: counts against the same limits. Its own database, since tests clear it.
CACHES = {
    "default": {
        # Django's RedisCache with one bounded pool per process (api/cache.py says why).
        "BACKEND": "api.cache.SharedPoolRedisCache",
        "LOCATION": os.environ.get("SYMPHONY_CACHE_URL", "redis://127.0.0.1:6379/3"),
        "KEY_PREFIX": "symphony",
        "OPTIONS": {
            "pool_class": "redis.BlockingConnectionPool",
            "max_connections": int(os.environ.get("SYMPHONY_CACHE_MAX_CONNECTIONS", "16")),
            "timeout": 2,
        },
    }
}
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("CELERY_DEFAULT_QUEUE", "symphony")
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
#: One ``celery beat`` per deployment sends these to the default queue.
CELERY_BEAT_SCHEDULE = {
    "reap-orphaned-runs": {"task": "api.reap_orphaned_runs", "schedule": 30.0},
    "meter-kv-storage": {"task": "api.meter_kv_storage", "schedule": 300.0},  # billing.KV_METER_PERIOD_S
    "expire-finished-streams": {"task": "api.expire_finished_streams", "schedule": 3600.0},
    "expire-response-kv": {"task": "api.expire_response_kv", "schedule": 300.0},
}

# --- Symphony -----------------------------------------------------------------------------
#: Admin socket of the local gpu_worker (control plane → worker; never mounted in a sandbox).
SYMPHONY_WORKER_ADMIN_SOCKET = os.environ.get(
    "SYMPHONY_WORKER_ADMIN_SOCKET", str(VAR_DIR / "run" / "worker-admin.sock")
)
#: Seconds an executor holds a queued run for its gpu_worker while the worker says it is starting
#: (loading the model; the first start on a machine compiles it): api/services/worker_start.py.
SYMPHONY_WORKER_START_WAIT_S = float(os.environ.get("SYMPHONY_WORKER_START_WAIT_S", "900"))
SYMPHONY_SANDBOX_IMAGE = os.environ.get("SYMPHONY_SANDBOX_IMAGE", "")
SYMPHONY_MAX_PROGRAM_BYTES = int(os.environ.get("SYMPHONY_MAX_PROGRAM_BYTES", str(1024 * 1024)))
#: Bytes of any request body: a larger one is a 413 before Django reads it (web/body_limit.py),
#: by its Content-Length or, chunked, once that much arrived. Room for a program and its fields.
SYMPHONY_MAX_REQUEST_BYTES = int(
    os.environ.get("SYMPHONY_MAX_REQUEST_BYTES", str(SYMPHONY_MAX_PROGRAM_BYTES + 1024 * 1024))
)
#: Django's own checks of the same bound (request.body, form fields), and bodies within it are
#: parsed in memory; a program file past its limit is refused while it streams (api/uploads.py).
DATA_UPLOAD_MAX_MEMORY_SIZE = SYMPHONY_MAX_REQUEST_BYTES
#: Requests in flight per client address and per web process, and how long a request body may
#: pause between chunks (web/inflight_limit.py). The total defaults to 3/4 of the fd limit.
SYMPHONY_MAX_INFLIGHT_PER_CLIENT = int(os.environ.get("SYMPHONY_MAX_INFLIGHT_PER_CLIENT", "128"))
SYMPHONY_MAX_INFLIGHT_TOTAL = int(os.environ.get("SYMPHONY_MAX_INFLIGHT_TOTAL") or 0) or default_total_limit()
SYMPHONY_BODY_IDLE_TIMEOUT_S = float(os.environ.get("SYMPHONY_BODY_IDLE_TIMEOUT_S", "30"))
FILE_UPLOAD_MAX_MEMORY_SIZE = SYMPHONY_MAX_REQUEST_BYTES
FILE_UPLOAD_HANDLERS = [
    "api.uploads.BoundedUploadHandler",
    "django.core.files.uploadhandler.MemoryFileUploadHandler",
    "django.core.files.uploadhandler.TemporaryFileUploadHandler",
]
#: Bytes of each of a run's stdout/stderr kept in the database (the tail; the sandbox's own
#: output limit, 1 MiB by default, bounds what is captured at all).
SYMPHONY_RUN_OUTPUT_KEEP_BYTES = int(os.environ.get("SYMPHONY_RUN_OUTPUT_KEEP_BYTES", str(64 * 1024)))
#: OpenTelemetry export of each finished run's trace (api/services/otel_export.py): the OTLP/HTTP
#: collector's base URL ("/v1/traces" is appended); empty (the default), nothing is exported and
#: the SDK is never loaded. OTEL_SERVICE_NAME, OTEL_EXPORTER_OTLP_HEADERS and the OTEL_BSP_*
#: batch settings are read by the SDK itself.
OTEL_EXPORTER_OTLP_ENDPOINT = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
#: Seconds a run's event stream stays in Redis after the run ends (replays, reconnects, the
#: console's live view of a finished run); afterwards its events endpoint sends the closing
#: status and end from the run's row.
SYMPHONY_RUN_EVENTS_RETENTION_S = int(os.environ.get("SYMPHONY_RUN_EVENTS_RETENTION_S", str(24 * 3600)))


def _process_memory_bytes() -> int:
    """The memory this process may use: its cgroup's limit when it has one, else the machine's."""
    try:
        raw = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if raw != "max":
            return int(raw)
    except (OSError, ValueError):
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


#: Bytes of this web process's memory that replays of finished runs' event streams may hold,
#: all together (api/services/replay_memory.py: each account gets a share): 1/16 of what the
#: process may use unless set.
SYMPHONY_REPLAY_MEMORY_BYTES = int(os.environ.get("SYMPHONY_REPLAY_MEMORY_BYTES") or _process_memory_bytes() // 16)
#: A replay whose client takes nothing for this long is stopped (its slot and memory freed).
SYMPHONY_REPLAY_STALL_S = float(os.environ.get("SYMPHONY_REPLAY_STALL_S", "10"))
#: Event streams one tenant may hold open at once, unless its plan sets
#: ``max_concurrent_streams`` (api/services/stream_leases.py); past it a 429 with Retry-After.
SYMPHONY_STREAMS_PER_TENANT = int(os.environ.get("SYMPHONY_STREAMS_PER_TENANT", "32"))
#: How long the cache remembers which account an API key belongs to (api/services/key_accounts.py):
#: it only says whose share of the database connections the key's lookup waits in.
SYMPHONY_KEY_ACCOUNT_CACHE_S = int(os.environ.get("SYMPHONY_KEY_ACCOUNT_CACHE_S", "600"))
# How long an OpenAI request over its plan's concurrent-run limit waits for a slot before the
# 429 (with Retry-After): clients that send a few requests at once are queued, not refused.
SYMPHONY_OPENAI_QUEUE_S = float(os.environ.get("SYMPHONY_OPENAI_QUEUE_S", "10"))
#: The built-in OpenAI program runs in this process, in a thread against the local worker's
#: session socket, instead of a Celery hop and a gVisor sandbox per request (it is our own code;
#: tenant input is data to it). Same run rows, quotas, events and billing
#: (api/services/trusted_runs.py). Off ("0"): every request takes the sandbox path.
SYMPHONY_TRUSTED_BUILTIN = env_bool("SYMPHONY_TRUSTED_BUILTIN", True)
#: Built-in runs executing at once in one web process (past it, a run takes the Celery path).
SYMPHONY_TRUSTED_THREADS = int(os.environ.get("SYMPHONY_TRUSTED_THREADS", "8"))
#: Days an invitation link stays valid, and tenants one user may own (each has its own quota).
SYMPHONY_INVITATION_DAYS = int(os.environ.get("SYMPHONY_INVITATION_DAYS", "7"))
SYMPHONY_MAX_OWNED_TENANTS = int(os.environ.get("SYMPHONY_MAX_OWNED_TENANTS", "3"))
# Failed sign-ins of one account, from any addresses, before its password sign-in is locked
# with exponential back-off (api/services/login_lockout.py).
SYMPHONY_LOGIN_LOCK_AFTER = int(os.environ.get("SYMPHONY_LOGIN_LOCK_AFTER", "10"))
#: The first lock's seconds (each later one doubles) and the longest lock.
SYMPHONY_LOGIN_LOCK_FIRST_S = int(os.environ.get("SYMPHONY_LOGIN_LOCK_FIRST_S", "60"))
SYMPHONY_LOGIN_LOCK_MAX_S = int(os.environ.get("SYMPHONY_LOGIN_LOCK_MAX_S", "3600"))

# --- Mail (password resets, invitations, security notices; api/services/mail.py) ---------------
#: Where the console is reached from outside: the links in mails point here.
SYMPHONY_PUBLIC_URL = (os.environ.get("SYMPHONY_PUBLIC_URL") or "http://127.0.0.1:8000").rstrip("/")
#: ``smtp://[user:password@]host[:port]`` (``smtp+tls://`` for STARTTLS, ``smtps://`` for TLS from
#: the start); unset, each mail is written as a file under var/mail/ (what ``make up`` uses).
EMAIL_URL = os.environ.get("SYMPHONY_EMAIL_URL", "")
if EMAIL_URL:
    _mail = urlsplit(EMAIL_URL)
    if _mail.scheme not in ("smtp", "smtp+tls", "smtps") or not _mail.hostname:
        raise RuntimeError(f"SYMPHONY_EMAIL_URL must be smtp://, smtp+tls:// or smtps://host[:port], not {EMAIL_URL!r}")
    EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    EMAIL_HOST = _mail.hostname
    EMAIL_PORT = _mail.port or {"smtp": 25, "smtp+tls": 587, "smtps": 465}[_mail.scheme]
    EMAIL_HOST_USER = unquote(_mail.username or "")
    EMAIL_HOST_PASSWORD = unquote(_mail.password or "")
    EMAIL_USE_TLS = _mail.scheme == "smtp+tls"
    EMAIL_USE_SSL = _mail.scheme == "smtps"
    EMAIL_TIMEOUT = int(os.environ.get("SYMPHONY_EMAIL_TIMEOUT_S", "10"))
else:
    EMAIL_BACKEND = "django.core.mail.backends.filebased.EmailBackend"
    EMAIL_FILE_PATH = VAR_DIR / "mail"
DEFAULT_FROM_EMAIL = os.environ.get("SYMPHONY_EMAIL_FROM") or "Symphony <noreply@localhost>"
#: Seconds a password-reset link stays valid (Django's token; one use: it dies with the old password).
PASSWORD_RESET_TIMEOUT = int(os.environ.get("SYMPHONY_PASSWORD_RESET_S") or 3600)
#: Shares (percent) of a monthly token quota at which the tenant's owners are mailed, once each a month.
SYMPHONY_QUOTA_ALERT_PERCENTS = env_list("SYMPHONY_QUOTA_ALERT_PERCENTS", "80,100")

# --- DRF ----------------------------------------------------------------------------------
REST_FRAMEWORK: dict[str, Any] = {
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_AUTHENTICATION_CLASSES": ["api.session_authentication.ConsoleSessionAuthentication"],
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Symphony API",
    "DESCRIPTION": "Serve LLM inference programs: tenants, API keys, programs, runs, KV files, usage.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # /v1/* and the run events stream are plain (async) Django views, which drf-spectacular
    # does not see: the hook adds their operations.
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "api.openapi_extra.add_plain_views",
    ],
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"kv": {"format": "ts=%(asctime)s level=%(levelname)s logger=%(name)s %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "kv"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO")},
}

if not DEBUG:
    SECURE_SSL_REDIRECT = env_bool("DJANGO_SECURE_SSL_REDIRECT", True)
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
    SECURE_HSTS_SECONDS = int(os.environ.get("DJANGO_HSTS_SECONDS", "31536000"))
    SECURE_HSTS_INCLUDE_SUBDOMAINS = True
    SECURE_HSTS_PRELOAD = True
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")

# --- Control plane (api/) ---------------------------------------------------------------------
SYMPHONY_WORKER_NAME = os.environ.get("SYMPHONY_WORKER_NAME", "local")
#: Bearer token for ``GET /metrics`` (Prometheus); unset: served to loopback requests only.
SYMPHONY_METRICS_TOKEN = os.environ.get("SYMPHONY_METRICS_TOKEN", "")
#: Addresses or CIDRs of the reverse proxies / load balancers in front of the web processes,
#: whose X-Forwarded-For is believed (api/client_address.py); empty: the header is ignored.
SYMPHONY_TRUSTED_PROXIES = env_list("SYMPHONY_TRUSTED_PROXIES", "")
#: "heartbeat": runs go to the live worker with the best KV affinity (api/services/routing.py);
#: "static": always to SYMPHONY_WORKER_NAME (one-host deployments, tests).
SYMPHONY_ROUTING = os.environ.get("SYMPHONY_ROUTING", "heartbeat")
#: The model name the OpenAI-compatible endpoints report (the worker's model directory name).
SYMPHONY_MODEL_NAME = (
    os.environ.get("SYMPHONY_MODEL_NAME") or Path(os.environ.get("SYMPHONY_MODEL") or "SmolLM2-135M-Instruct").name
)
REST_FRAMEWORK.update(
    {
        "DEFAULT_AUTHENTICATION_CLASSES": [
            "api.authentication.ApiKeyAuthentication",
            "api.session_authentication.ConsoleSessionAuthentication",
        ],
        "EXCEPTION_HANDLER": "api.errors.exception_handler",
        # JSON as PostgreSQL can store it (no NaN, 1e400 or lone surrogates): a 400, not a 500.
        "DEFAULT_PARSER_CLASSES": [
            "api.parsers.StorableJSONParser",
            "rest_framework.parsers.FormParser",
            "rest_framework.parsers.MultiPartParser",
        ],
        # A place in the account's share of the process's database connections (api/db_admission.py;
        # an API key's request has it from before its key was looked up), then each tenant's
        # plan.api_requests_per_minute, shared by its keys and members (api/throttling.py), whose
        # read of the plan is a database call too.
        "DEFAULT_THROTTLE_CLASSES": ["api.throttling.AccountDbShareThrottle", "api.throttling.TenantRateThrottle"],
        # Throttles key on REMOTE_ADDR, which api/client_address.py already resolved through the
        # trusted proxies; None would make DRF key on the raw X-Forwarded-For a client writes.
        "NUM_PROXIES": 0,
        "DEFAULT_PAGINATION_CLASS": "api.pagination.BoundedLimitOffsetPagination",
        "PAGE_SIZE": 50,
        "DEFAULT_THROTTLE_RATES": {
            "auth": os.environ.get("SYMPHONY_AUTH_THROTTLE", "20/min"),
            # Wrong bearer keys per client address before it is refused outright (api/authentication.py).
            "bad_api_key": os.environ.get("SYMPHONY_BAD_KEY_THROTTLE", "30/min"),
        },
    }
)

"""Sluice settings: one file, everything that varies comes from the environment."""

from __future__ import annotations

import hashlib
import os
import secrets
import sys
import warnings
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from config import role
from config.env import (
    database_from_url,
    env_bool,
    env_int,
    env_str,
    local_secret,
    read_instance_env,
)

BASE_DIR = Path(__file__).resolve().parent.parent

# Where the servers are: the environment first, else the instance `make run` started in this
# checkout (it records its URLs in var/run/env, 0600), so an operator command in that checkout
# reaches that instance with no extra settings. A worker is handed its own Redis URL and no
# database, so it never reads the file (it holds the server's unrestricted URLs).
INSTANCE_ENV_FILE = BASE_DIR / "var" / "run" / "env"
# All or nothing: a DATABASE_URL from the environment never pairs with the instance's Redis.
_instance = (
    {} if role.WORKER or os.environ.get("DATABASE_URL") else read_instance_env(INSTANCE_ENV_FILE)
)
# What keeps this process from starting, said in one line (manage.py prints it): both the
# secret and the database when both are missing, so neither hides the other.
_problems: list[str] = []
DEBUG = env_bool("DEBUG", False)
SECRET_KEY = env_str("SECRET_KEY", "")
if not SECRET_KEY and role.WORKER:
    # A worker signs nothing with it (its assignments are signed with its token's hash):
    # a random key that lives as long as the process keeps Django content.
    SECRET_KEY = secrets.token_urlsafe(48)
elif not SECRET_KEY:
    # Never a key written in the source: it signs sessions and seeds the log hashes. A local
    # run (make run / make test / CI opt in with SLUICE_LOCAL_SECRET=1, or DEBUG) gets a random
    # key kept in var/ for this checkout; anything else must be given SECRET_KEY.
    # pytest (8.2+) names itself in PYTEST_VERSION: a test session is a local run too.
    # An operator command reaching a `make run` instance uses that instance's local key.
    local_run = (
        env_bool("SLUICE_LOCAL_SECRET", False) or _instance.get("SLUICE_LOCAL_SECRET") == "1"
    )
    if not (DEBUG or local_run or os.environ.get("PYTEST_VERSION")):
        _problems.append(
            "SECRET_KEY is not set. Set it (and the same value on every API process); "
            "for a local run set SLUICE_LOCAL_SECRET=1 instead."
        )
    else:
        SECRET_KEY = local_secret(BASE_DIR / "var" / "local-secret-key")
# The test suite and the type checker (which imports settings to learn the models and opens
# nothing) keep the machine's local default; nothing else may guess a database.
_LOCAL_DEFAULTS_OK = bool(os.environ.get("PYTEST_VERSION")) or "mypy" in sys.modules
DATABASE_URL = env_str("DATABASE_URL", _instance.get("DATABASE_URL", ""))
if not DATABASE_URL and not role.WORKER:
    if not _LOCAL_DEFAULTS_OK:
        _problems.append(
            "DATABASE_URL is not set and no `make run` is running in this checkout "
            f"({INSTANCE_ENV_FILE.relative_to(BASE_DIR)}); start `make run` or set DATABASE_URL"
        )
    DATABASE_URL = "postgres://root@127.0.0.1:5432/test"
if _problems and role.HELP_ONLY:
    # Help opens nothing: a key that signs nothing, and the placeholder database above.
    SECRET_KEY = SECRET_KEY or secrets.token_urlsafe(48)
    _problems.clear()
if _problems:
    raise ImproperlyConfigured(" ".join(p.rstrip(".") + "." for p in reversed(_problems)))

ALLOWED_HOSTS = [
    h.strip() for h in env_str("ALLOWED_HOSTS", "127.0.0.1,localhost,[::1]").split(",") if h.strip()
]
CSRF_TRUSTED_ORIGINS = [
    o.strip() for o in env_str("CSRF_TRUSTED_ORIGINS", "").split(",") if o.strip()
]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    # Widget templates come from TEMPLATES (templates/ first), so a widget may have its own.
    "django.forms",
    "rest_framework",
    "workspaces",
    "admission",
    "dashboard",
    "api",
]

MIDDLEWARE = [
    # First: the async workspace endpoint skips the classic middleware below (see the module).
    "config.middleware.WorkspaceApiFastPath",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

FORM_RENDERER = "django.forms.renderers.TemplatesSetting"

ROOT_URLCONF = "config.urls"
ASGI_APPLICATION = "config.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
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

# A worker has no database: Django's dummy backend makes any query it tried fail loudly
# instead of quietly reaching for a Postgres the worker machine does not have.
DATABASES = {} if role.WORKER else {"default": database_from_url(DATABASE_URL)}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# Redis: the Celery broker, and (unless split out) admission, rate limits and the log buffer.
REDIS_URL = env_str("REDIS_URL", _instance.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
ADMISSION_REDIS_URL = env_str(
    "ADMISSION_REDIS_URL", _instance.get("ADMISSION_REDIS_URL", REDIS_URL)
)
# On: ADMISSION_REDIS_URL names any one node of a Redis Cluster (the clients find the rest).
# The Celery broker (REDIS_URL / CELERY_BROKER_URL) stays a plain Redis either way.
ADMISSION_REDIS_CLUSTER = env_bool("ADMISSION_REDIS_CLUSTER", False)
# On: every worker gets a Redis ACL user of its own when its token is issued (bootstrap, admin
# rotation), confined to its own keys (admission/credentials.py). Off only for a Redis that
# cannot do ACLs: then every worker holds the deployment's REDIS_URL (docs/security.md).
SLUICE_WORKER_REDIS_ACL = env_bool("SLUICE_WORKER_REDIS_ACL", True)
# Every key Sluice writes starts with this; tests give each run its own.
REDIS_KEY_PREFIX = env_str("SLUICE_REDIS_PREFIX", _instance.get("SLUICE_REDIS_PREFIX", "sluice:"))

# Django's own cache, on Redis through django-redis: admin sessions (cached_db: Postgres keeps
# them through a Redis restart) and what Django caches for the admin. Admission's scripts keep
# their own redis-py clients (admission/connections.py), on ADMISSION_REDIS_URL.
CACHES = {
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": REDIS_KEY_PREFIX + "cache",
        "OPTIONS": {"SOCKET_CONNECT_TIMEOUT": 2, "SOCKET_TIMEOUT": 2},
    }
}
SESSION_ENGINE = "django.contrib.sessions.backends.cached_db"

# Celery carries assignments to workers. At-most-once: a message is acked when the worker
# takes it (not after it ran), one message is prefetched per free slot, and the Redis
# transport's ack emulation is off: a popped message is gone from Redis, so nothing can ever
# hand it out again (and no delivery bookkeeping costs two round trips per message).
CELERY_BROKER_URL = env_str("CELERY_BROKER_URL", REDIS_URL)
CELERY_TASK_ACKS_LATE = False
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_IGNORE_RESULT = True
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "ack_emulation": False,
    "global_keyprefix": REDIS_KEY_PREFIX + "celery:",
}
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# A worker waits out a Redis outage of any length (Celery's default gives up after 100 tries,
# about 200 s with the worker's quick reconnect, and the worker then exits for good).
CELERY_BROKER_CONNECTION_MAX_RETRIES = None
CELERY_TASK_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
CELERY_WORKER_SEND_TASK_EVENTS = False
CELERY_WORKER_ENABLE_REMOTE_CONTROL = False
CELERY_WORKER_CANCEL_LONG_RUNNING_TASKS_ON_CONNECTION_LOSS = False

# Admission and rate-limit policy: the admin-editable policy row starts from these.
SLUICE_POLICY_DEFAULTS = {
    "JOB_TIMEOUT": env_int("JOB_TIMEOUT", 300_000, low=1_000, high=3_600_000),
    "WORKSPACE_QUEUE_CEILING_MS": env_int(
        "WORKSPACE_QUEUE_CEILING_MS", 300_000, low=1, high=300_000
    ),
    "WORKER_QUEUE_LIMIT": env_int("WORKER_QUEUE_LIMIT", 32, low=1, high=1024),
    "WORKER_FLOW_SHARE_PERCENT": env_int("WORKER_FLOW_SHARE_PERCENT", 50, low=1, high=100),
    "CODEAPI_BRIDGE_MAX_WORKSPACE_LEASE_SLOTS": env_int(
        "CODEAPI_BRIDGE_MAX_WORKSPACE_LEASE_SLOTS", 8, low=1, high=64
    ),
    "WORKSPACE_TOOLS_RATE_LIMIT": env_str("WORKSPACE_TOOLS_RATE_LIMIT", "120/30s"),
}
ISOLATION_KEY_SECRET = env_str(
    "ISOLATION_KEY_SECRET",
    hashlib.sha256(b"sluice-isolation-key:" + SECRET_KEY.encode()).hexdigest(),
)
# Completion rows older than this are removed by `manage.py prune_completions`.
COMPLETION_RETENTION_DAYS = env_int("COMPLETION_RETENTION_DAYS", 30, low=1, high=3650)

# A worker that has not been heard from for this long is offline (contract §4.1).
WORKER_OFFLINE_AFTER_S = 30
WORKER_HEARTBEAT_S = 5

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["api.authentication.ApiKeyAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "EXCEPTION_HANDLER": "api.errors.exception_handler",
    "DEFAULT_SCHEMA_CLASS": "api.schema.inspect.SluiceAutoSchema",
    "UNAUTHENTICATED_USER": None,
}

# The execute endpoint refuses bodies over this with 413 (a 1 MiB write plus JSON framing).
DATA_UPLOAD_MAX_MEMORY_SIZE = 4 * 1024 * 1024
# Workspace API requests one API process carries at once, waiting calls included; the next
# gets 503 SERVICE_OVERLOADED with Retry-After (contract §2.8), before its body is read.
SLUICE_MAX_CALLS_IN_FLIGHT = env_int("SLUICE_MAX_CALLS_IN_FLIGHT", 1000, low=1, high=100_000)
# Of those, what one credential (one API key, however its Authorization header spells it)
# may hold: one principal's burst fills its share and is refused the same way, while every
# other caller still finds room.
SLUICE_MAX_CALLS_IN_FLIGHT_PER_KEY = env_int(
    "SLUICE_MAX_CALLS_IN_FLIGHT_PER_KEY",
    max(1, SLUICE_MAX_CALLS_IN_FLIGHT // 2),
    low=1,
    high=100_000,
)
# A request's body must have arrived whole this long after its headers, on every route; a
# slower one is refused 408 REQUEST_BODY_TIMEOUT and its place is freed (contract §2.8).
SLUICE_REQUEST_BODY_TIMEOUT_S = env_int("SLUICE_REQUEST_BODY_TIMEOUT_S", 30, low=1, high=3_600)
# The bridge routes' rate limits (docs/rate-limits.md): per API key (a request without a
# well-formed key: per client address), and for redeem, whose caller holds no key yet, per
# client address. Over them: 429 BRIDGE_RATE_LIMITED with Retry-After, before the body is read.
SLUICE_BRIDGE_RATE_LIMIT = env_str("SLUICE_BRIDGE_RATE_LIMIT", "120/1m")
SLUICE_BRIDGE_REDEEM_RATE_LIMIT = env_str("SLUICE_BRIDGE_REDEEM_RATE_LIMIT", "20/1m")
# Of one credential's calls, how many may be on their way into admission at once (from the
# edge until they are in their worker's queue or answered); the others wait their turn in
# arrival order, at no cost: one credential's burst takes this much of the event loop, not all
# of it (api/execute/burst.py). A call that waits in its queue has left this count.
SLUICE_ADMITTING_PER_KEY = env_int("SLUICE_ADMITTING_PER_KEY", 4, low=1, high=10_000)
# A worker's queue found full is taken as full this long for the caller that found it: its
# next calls to that worker are refused without asking Redis meanwhile (0: every call asks).
SLUICE_FULL_QUEUE_HOLD_MS = env_int("SLUICE_FULL_QUEUE_HOLD_MS", 20, low=0, high=1_000)

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en-us"
FORMAT_MODULE_PATH = ["config.formats"]
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "var" / "static"
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
WHITENOISE_USE_FINDERS = True
# WhiteNoise serves files through a synchronous iterator, which Django's ASGI handler reads on a
# thread and warns about on every static file; for a few small files that is fine, and the
# warning only buries real ones in the `make run` terminal.
warnings.filterwarnings(
    "ignore",
    message="StreamingHttpResponse must consume synchronous iterators",
)

SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = False
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
SECURE_CROSS_ORIGIN_OPENER_POLICY = "same-origin"
SESSION_COOKIE_SECURE = env_bool("SECURE_COOKIES", False)
CSRF_COOKIE_SECURE = SESSION_COOKIE_SECURE

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "json": {"()": "config.logging.JsonFormatter"},
    },
    "filters": {
        "typed_api_answers": {"()": "config.logging.TypedApiAnswersFilter"},
    },
    "handlers": {
        "stdout": {
            "class": "logging.StreamHandler",
            "stream": "ext://sys.stdout",
            "formatter": "json",
        },
    },
    "root": {"handlers": ["stdout"], "level": env_str("LOG_LEVEL", "INFO")},
    "loggers": {
        "django.request": {"level": "ERROR", "filters": ["typed_api_answers"]},
        "celery": {"level": "WARNING"},
    },
}

# Admin login throttle (django-axes): 5 wrong passwords for one username from one address lock
# that pair out for 15 minutes; other users, and the same user elsewhere, still sign in, so a
# guesser cannot lock the real admin out. `manage.py axes_reset` lifts every lock (docs/operations.md).
INSTALLED_APPS += ["axes"]
# Last, as axes asks: it turns the backend's refusal into the lockout page.
MIDDLEWARE += ["axes.middleware.AxesMiddleware"]
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = env_int("ADMIN_LOGIN_FAILURE_LIMIT", 5, low=1, high=1000)
# In hours: axes reads a float as hours.
AXES_COOLOFF_TIME = env_int("ADMIN_LOGIN_COOLOFF_MIN", 15, low=1, high=10_080) / 60
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True
AXES_LOCKOUT_CALLABLE = "config.login_throttle.lockout_response"
# REMOTE_ADDR: the socket's peer, or what a proxy uvicorn trusts (FORWARDED_ALLOW_IPS) put in
# X-Forwarded-For; never a forwarding header read by axes itself, which any client can write.
AXES_CLIENT_IP_CALLABLE = "config.login_throttle.remote_addr"
# No start-up line (INFO) from every process, management commands included; failures and
# lockouts (WARNING, username and address masked) are still logged. (The ignore: mypy reads
# LOGGING's literal as dict[str, object].)
LOGGING["loggers"]["axes"] = {"level": "WARNING"}  # type: ignore[index]

"""What an IAM or IKS error may show: credentials masked, long bodies cut.

Error bodies go into `pulumi up`'s error and log (the dynamic provider host sends the exception's traceback to the
engine: pulumi/dynamic/__main__.py `_abort_with_traceback`), and a proxy or gateway in between may echo the request
into its answer: the IAM token request's form (`apikey=...`), or the IKS request's `Authorization: Bearer ...`.
The SDK's own redaction (ibm_cloud_sdk_core/logger.py LoggingFilter.redact_secrets: `Authorization:`/`X-Auth*`
headers, `apikey=`-style settings and quoted JSON fields named like a secret) runs first; on top of it the literal
values of the credentials this client holds, any bearer or basic credential, any JWT (IAM access tokens are JWTs)
and unquoted JSON-ish `"apikey": value` forms.
"""
import re
import urllib.parse
from typing import Iterable

from ibm_cloud_sdk_core.logger import LoggingFilter

MASK = "[redacted]"
MAX_TEXT = 600  # characters of an API's own text kept in an error; IBM's messages are far shorter

_BEARER = re.compile(r"(?i)\b(bearer|basic)\s+[A-Za-z0-9._~+/=-]{8,}")
_JWT = re.compile(r"\beyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*")
# "apikey": value / 'apikey': value with the value not in double quotes (the SDK's pattern needs "..." values), and
# apikey: value in YAML-ish or header-ish echoes.
_FIELD = re.compile(r"""(?i)(["']?\b(?:api[_-]?key|apikey|refresh_token|access_token|password|passcode|secret)"""
                    r"""["']?\s*[:=]\s*)(?!["']?\[redacted\])("[^"]*"|'[^']*'|[^\s,;&}"']+)""")


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` with every credential masked: the literal `secrets` (also URL-encoded, as a form carries them) and
    whatever looks like a key or token."""
    for secret in sorted({s for s in secrets if s and len(s) >= 4}, key=len, reverse=True):
        for form in {secret, urllib.parse.quote_plus(secret), urllib.parse.quote(secret, safe="")}:
            text = text.replace(form, MASK)
    text = LoggingFilter.redact_secrets(text)
    text = _BEARER.sub(lambda m: f"{m.group(1)} {MASK}", text)
    text = _JWT.sub(MASK, text)
    return _FIELD.sub(lambda m: m.group(1) + MASK, text)


def clip(text: str, limit: int = MAX_TEXT) -> str:
    """At most `limit` characters of `text`, saying how many were cut."""
    text = text.strip()
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters cut)"


def safe(text: str, secrets: Iterable[str] = ()) -> str:
    """Redacted first (a cut must never leave half a key behind unmasked), then clipped."""
    return clip(redact(text, secrets))

"""The HTTP half of `aleph data fetch --captions`: a file's record by HEAD and a resumable,
bounded GET into a partial file, against a server that may be hostile.

huggingface_hub's session (HF_TOKEN, HF_ENDPOINT apply), redirects followed here: at most
`FetchLimits.redirects`, http(s) only (HEAD: same origin; GET: the token dropped across
origins). The GET reads the raw body of an identity encoding, never more than the announced
size (of an error answer, 4 KiB); one deadline covers every attempt, a transfer below
`min_rate` is cut and resumed, and `hard_deadline` ends headers that trickle in. The partial
file is `open_write_nofollow`ed: a link or FIFO is refused before a byte is written, and
never removed.
"""

from __future__ import annotations

import math
import os
import re
import stat
import time
from contextlib import closing
from dataclasses import dataclass, fields, replace
from pathlib import Path
from urllib.parse import urljoin, urlsplit

from aleph._io import NotRegularFile, file_kind, open_write_nofollow
from aleph._signals import alarm_at
from aleph.errors import ConfigError, DataError

ENV_PREFIX = "ALEPH_FETCH_"  # ALEPH_FETCH_DEADLINE_S=30 overrides FetchLimits.deadline_s


@dataclass(frozen=True)
class FetchLimits:
    """Every bound of one `data fetch --captions` call, declared here and nowhere else."""

    deadline_s: float = 6 * 3600.0
    """Seconds for the whole download, all attempts together (3.58 GB: an hour at 1 MB/s)."""
    min_rate: float = 32 * 1024
    """Bytes/s a transfer must average over each `rate_window_s`, else cut and resumed."""
    rate_window_s: float = 60.0
    """Seconds over which `min_rate` is measured; also the longest wait for one read."""
    connect_timeout_s: float = 30.0
    """Seconds to connect to the server."""
    head_timeout_s: float = 60.0
    """Wall-clock seconds for the file record (the HEAD request and its redirects)."""
    redirects: int = 5
    """Redirects followed per request; one more is refused."""
    attempts: int = 3
    """GET requests per call, each resuming where the last stopped."""

    @classmethod
    def from_env(cls, environ: dict | None = None) -> FetchLimits:
        """The defaults, each overridden by ALEPH_FETCH_<FIELD> (e.g. ALEPH_FETCH_MIN_RATE)
        when set; a value that is not a positive number (redirects: >= 0) is a ConfigError."""
        env = os.environ if environ is None else environ
        out = {}
        for f in fields(cls):
            name = ENV_PREFIX + f.name.upper()
            if (text := env.get(name)) is None:
                continue
            kind, zero_ok = int if f.type == "int" else float, f.name == "redirects"
            try:
                value = kind(text)
            except ValueError:
                value = None
            bad = value is None or not math.isfinite(value) or value < 0
            if bad or (value == 0 and not zero_ok):
                raise ConfigError(f"{name}={text!r}: expected "
                                  f"{'an integer' if kind is int else 'a number'} "
                                  f"{'>= 0' if zero_ok else '> 0'}")
            out[f.name] = value
        return replace(cls(), **out)


class TransferCut(Exception):
    """A transfer that stopped early and may be resumed (network error, too slow)."""


def hard_deadline(deadline: float, what: str):
    """A DataError naming `what` at `deadline` (time.monotonic()): `_signals.alarm_at`."""
    return alarm_at(deadline, DataError(f"{what}: no answer within its deadline; refused "
                                        f"(limits: {ENV_PREFIX}HEAD_TIMEOUT_S, "
                                        f"{ENV_PREFIX}DEADLINE_S)"))


def _origin(url: str) -> tuple[str, str]:
    u = urlsplit(url)
    return u.scheme, u.netloc


def send(method: str, url: str, headers: dict, limits: FetchLimits, deadline: float, *,
         same_origin_only: bool):
    """The streamed response (the caller closes it) to `method url` after at most
    `limits.redirects` redirects, else a DataError; with same_origin_only a redirect
    elsewhere is returned as it is (as huggingface_hub does for a file record)."""
    import httpx
    from huggingface_hub.utils import get_session

    client, headers = get_session(), dict(headers)
    for _hop in range(limits.redirects + 1):
        left = max(deadline - time.monotonic(), 0.001)
        timeout = httpx.Timeout(min(limits.rate_window_s, left),
                                connect=min(limits.connect_timeout_s, left))
        r = client.send(client.build_request(method, url, headers=headers, timeout=timeout),
                        stream=True, follow_redirects=False)
        location = r.headers.get("location") if r.is_redirect else None
        if location is None:
            return r
        target = urljoin(url, location)
        if urlsplit(target).scheme not in ("http", "https"):
            r.close()
            raise DataError(f"{method} {urlsplit(url).path}: redirect to {location[:200]!r}; "
                            "expected an http(s) URL")
        if same_origin_only and _origin(target) != _origin(url):
            return r
        r.close()
        if _origin(target) != _origin(url):  # the token goes to its own origin only
            headers.pop("Authorization", None)
        url = target
    raise DataError(f"{method} {urlsplit(url).path}: more than {limits.redirects} redirects "
                    f"(the last to {location[:200]!r}); refused (limit: {ENV_PREFIX}REDIRECTS)")


def hub_headers() -> dict:
    """The headers of every request: the hub token (HF_TOKEN, or a saved login) and
    `Accept-Encoding: identity`. Not huggingface_hub's build_hf_headers: that first GETs the
    endpoint's /api/agent-harnesses (telemetry) with unbounded redirects and reads."""
    from huggingface_hub import get_token

    headers = {"User-Agent": "aleph-e1/data-fetch", "Accept-Encoding": "identity"}
    if token := get_token():
        headers["Authorization"] = f"Bearer {token}"
    return headers


_DIGITS = re.compile(r"[0-9]{1,19}")


def file_record(url: str, what: str, limits: FetchLimits) -> dict:
    """{'commit', 'size', 'sha256'} of the file at `url` from a HEAD: X-Repo-Commit,
    X-Linked-Etag (else ETag), X-Linked-Size (else Content-Length). A bad size is a
    DataError naming `what`; network and HTTP errors propagate (the caller words them)."""
    from huggingface_hub.utils import hf_raise_for_status

    headers = hub_headers()
    deadline = time.monotonic() + limits.head_timeout_s
    with hard_deadline(deadline + 1.0, what), \
            closing(send("HEAD", url, headers, limits, deadline, same_origin_only=True)) as r:
        hf_raise_for_status(r)
        h = r.headers
    commit = h.get("x-repo-commit") or ""
    etag = (h.get("x-linked-etag") or h.get("etag") or "").removeprefix("W/").strip('"').lower()
    size_text = h.get("x-linked-size") or h.get("content-length") or ""
    if not _DIGITS.fullmatch(size_text):
        raise DataError(f"{what}: size {size_text[:40]!r} (X-Linked-Size) is not a size in "
                        "bytes; expected a non-negative integer")
    return {"commit": commit, "size": int(size_text), "sha256": etag}


def _not_ours(part: Path, kind: str) -> DataError:
    return DataError(f"partial download {part} is {kind}; expected a regular file this "
                     "command wrote (it is left as it is: move it away)")


def open_partial(part: Path, resume: bool) -> int:
    """A write fd of the partial file `part` (`aleph._io.open_write_nofollow`), appended to
    when `resume`, else emptied; not a regular file: a DataError, the path left as it is."""
    try:
        return open_write_nofollow(part, append=resume, truncate=not resume)
    except NotRegularFile as e:
        raise _not_ours(part, e.kind) from None
    except OSError as e:
        raise DataError(f"partial download {part}: cannot open ({e.strerror})") from None


def partial_size(part: Path) -> int:
    """Bytes of the partial file (0 when missing), by lstat: a link (symbolic or hard) or
    a FIFO is refused."""
    try:
        st = os.lstat(part)
    except FileNotFoundError:
        return 0
    if not stat.S_ISREG(st.st_mode):
        raise _not_ours(part, file_kind(st.st_mode))
    if st.st_nlink > 1:  # a hard link: writing it would write the file's other name
        raise _not_ours(part, f"a file with {st.st_nlink} hard links")
    return st.st_size


def get_into(url: str, part: Path, have: int, size: int, limits: FetchLimits,
             deadline: float) -> None:
    """One GET of bytes `have`.. of a `size`-byte file into `part` (a 200 answer restarts
    from 0). TransferCut for what a retry may mend, DataError for a broken bound."""
    headers, what = hub_headers(), f"GET {urlsplit(url).path}"
    if have:
        headers["Range"] = f"bytes={have}-"
    with hard_deadline(deadline + limits.rate_window_s, what), \
            closing(send("GET", url, headers, limits, deadline, same_origin_only=False)) as r:
        if r.status_code >= 400:  # not hf_raise_for_status: it reads the whole body first
            raise TransferCut(_error_line(r))
        encoding = r.headers.get("content-encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            raise DataError(f"{what}: Content-Encoding {encoding[:40]!r}; expected the file's "
                            "own bytes (identity), asked for with Accept-Encoding: identity; "
                            "refused, nothing written")
        resumed = bool(have) and r.status_code == 206
        start = have if resumed else 0
        want = size - start
        length = r.headers.get("content-length")
        if length is not None and length.strip() != str(want):
            raise DataError(f"{what}: Content-Length {length[:40]!r}, expected {want:,} (bytes "
                            f"{start:,}.. of the announced {size:,}); refused, nothing written")
        with os.fdopen(open_partial(part, resumed), "wb") as f:
            _copy(r, f, want, size, limits, deadline, what)
            f.flush()
            os.fsync(f.fileno())


def _error_line(r, limit: int = 4096) -> str:
    """`HTTP <status> <reason>: <what the server says>`, one line, from the X-Error-Message
    header or at most `limit` bytes of the body (an error's body may never end)."""
    import httpx

    said, body = r.headers.get("x-error-message", ""), b""
    if not said:
        try:
            for chunk in r.iter_raw():
                body += chunk[: limit - len(body)]
                if len(body) >= limit:
                    break
        except httpx.HTTPError:
            pass
    text = " ".join((said or body.decode("utf-8", "replace")).split())[:300]
    return f"HTTP {r.status_code} {r.reason_phrase}" + (f": {text}" if text else "")


def _copy(r, f, want: int, size: int, limits: FetchLimits, deadline: float, what: str) -> None:
    """Raw body bytes into `f`, at most `want`; checks the deadline and the rate per read."""
    import httpx

    got, window_start, window_bytes = 0, time.monotonic(), 0
    try:
        for chunk in r.iter_raw():  # raw: no content decoding; each network read as it comes
            take = chunk[: want - got]
            f.write(take)
            got += len(take)
            if len(take) < len(chunk):
                raise DataError(f"{what}: the body is longer than the announced {size:,} "
                                "bytes; refused after writing those")
            now = time.monotonic()
            if now > deadline:
                raise DataError(f"{what}: not done within the {limits.deadline_s:g} s deadline "
                                f"({got:,} of {want:,} bytes this attempt; limit: "
                                f"{ENV_PREFIX}DEADLINE_S); run it again to resume")
            window_bytes += len(take)
            if now - window_start >= limits.rate_window_s:
                rate = window_bytes / (now - window_start)
                if rate < limits.min_rate:
                    raise TransferCut(f"{rate:,.0f} B/s over {now - window_start:.1f} s, below "
                                      f"the minimum {limits.min_rate:,.0f} B/s "
                                      f"({ENV_PREFIX}MIN_RATE)")
                window_start, window_bytes = now, 0
    except httpx.ReadTimeout:
        raise TransferCut(f"no byte for {min(limits.rate_window_s, deadline - window_start):.1f} s,"
                          f" below the minimum {limits.min_rate:,.0f} B/s "
                          f"({ENV_PREFIX}MIN_RATE over {ENV_PREFIX}RATE_WINDOW_S)") from None
    except httpx.HTTPError as e:
        raise TransferCut(f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}") from None

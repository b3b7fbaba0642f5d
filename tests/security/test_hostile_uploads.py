"""Program uploads built to break the checker: zips with a bad CRC, an encrypted member, an
unknown compression method or corrupt deflate data, and Python sources that make the parser or
compiler give up (RecursionError, MemoryError) or hold NUL bytes.

Each was a 500 (the exception escaped the upload check); each is now a 400 ``invalid_program``
whose message names the problem. Through the real URL conf, multipart parsing and PostgreSQL,
with a Django test client that reports a server error as a response rather than raising it."""

from __future__ import annotations

import io
import struct
import time
import zipfile

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from rest_framework.test import APIClient

from api.models import Program

pytestmark = pytest.mark.django_db

GOOD = b"def main(args):\n    return {'ok': True}\n"
CANARY_S = 5.0


def _zip(files: dict[str, bytes], method: int = zipfile.ZIP_STORED) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", method) as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return buf.getvalue()


def _patched(content: bytes, name: str, *, flags: int = 0, method: int | None = None, data=None) -> bytes:
    """``content`` with member ``name``'s flag bits or compression method changed in both its
    local and central headers, or its stored bytes replaced by ``data(old)``."""
    info = zipfile.ZipFile(io.BytesIO(content)).getinfo(name)
    out = bytearray(content)
    local = info.header_offset
    name_len, extra_len = struct.unpack_from("<HH", out, local + 26)
    central = out.index(b"PK\x01\x02")
    while out[central + 46 : central + 46 + len(name)] != name.encode():
        central = out.index(b"PK\x01\x02", central + 4)
    for flag_at, method_at in ((local + 6, local + 8), (central + 8, central + 10)):
        out[flag_at : flag_at + 2] = struct.pack("<H", struct.unpack_from("<H", out, flag_at)[0] | flags)
        if method is not None:
            out[method_at : method_at + 2] = struct.pack("<H", method)
    if data is not None:
        start = local + 30 + name_len + extra_len
        out[start : start + info.compress_size] = data(bytes(out[start : start + info.compress_size]))
    return bytes(out)


def _flip_last(raw: bytes) -> bytes:
    return raw[:-2] + bytes([raw[-2] ^ 0x01]) + raw[-1:]


def _garbage(raw: bytes) -> bytes:
    return b"\xff" * len(raw)


HELPER = b"VALUE = 'a helper module of the program'\n" * 4
ZIPS = {
    "bad CRC of the entry": (_patched(_zip({"__main__.py": GOOD}), "__main__.py", data=_flip_last), "CRC"),
    "bad CRC of another member": (
        _patched(_zip({"__main__.py": GOOD, "lib/helper.py": HELPER}), "lib/helper.py", data=_flip_last),
        "lib/helper.py",
    ),
    "encrypted member": (_patched(_zip({"__main__.py": GOOD}), "__main__.py", flags=0x1), "encrypted"),
    "unknown compression method": (_patched(_zip({"__main__.py": GOOD}), "__main__.py", method=99), "compression"),
    "corrupt deflate data": (
        _patched(_zip({"__main__.py": GOOD * 20}, zipfile.ZIP_DEFLATED), "__main__.py", data=_garbage),
        "__main__.py",
    ),
    "truncated archive": (_zip({"__main__.py": GOOD})[:-30], "not a valid zip"),
}
SOURCES = {
    "100,000 unary minuses": (b"def main(args):\n    return " + b"-" * 100_000 + b"1\n", "nested"),
    "100,000 chained subscripts": (b"def main(args):\n    return a" + b"[0]" * 100_000 + b"\n", "nested"),
    "50,000 chained calls": (b"def main(args):\n    return f" + b"()" * 50_000 + b"\n", "nested"),
    "100,000 additions": (b"def main(args):\n    return " + b"+".join([b"1"] * 100_000) + b"\n", "nested"),
    "a NUL byte": (b"def main(args):\n    return 1\x00\n", "null bytes"),
    "invalid UTF-8": (b"def main(args):\n    return '\xff'\n", "utf-8"),
    "'return' outside a function": (b"return 1\ndef main(args):\n    pass\n", "outside function"),
}


def _client() -> APIClient:
    return APIClient(raise_request_exception=False)


def _upload(tenant, filename: str, content: bytes):
    client = _client()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {tenant.key_secret}")
    return client.post(
        "/api/v1/programs",
        {"name": filename, "file": SimpleUploadedFile(filename, content)},
        format="multipart",
    )


def _canary(tenant) -> None:
    started = time.monotonic()
    response = _upload(tenant, "canary.py", GOOD)
    assert response.status_code == 201, response.content
    assert time.monotonic() - started < CANARY_S


@pytest.mark.parametrize("case", ZIPS)
def test_a_damaged_or_unsupported_zip_is_a_400_naming_it(api_tenant_a, api_tenant_b, case):
    content, says = ZIPS[case]
    response = _upload(api_tenant_a, "p.zip", content)
    assert response.status_code == 400, response.content[:300]
    error = response.json()["error"]
    assert error["code"] == "invalid_program" and says.lower() in error["message"].lower(), error
    assert not Program.objects.filter(tenant=api_tenant_a.tenant).exists()
    _canary(api_tenant_b)


@pytest.mark.parametrize("case", SOURCES)
def test_a_source_python_cannot_compile_is_a_400_naming_it(api_tenant_a, api_tenant_b, case):
    content, says = SOURCES[case]
    for filename, upload in (("p.py", content), ("p.zip", _zip({"__main__.py": content}))):
        response = _upload(api_tenant_a, filename, upload)
        assert response.status_code == 400, response.content[:300]
        error = response.json()["error"]
        assert error["code"] == "invalid_program" and says.lower() in error["message"].lower(), error
    _canary(api_tenant_b)

"""KV file names, tenant ids and store keys are whole-string matches.

The patterns were anchored with ``^...$``, and ``$`` also matches before a trailing newline:
``"doc\\n"`` was a valid file name (and ``"acme\\n"`` a tenant), so a LIP could create a file
whose store key (``acme/doc\\n.safetensors``) the store then refused, and the console listed a
name no one could type. They are matched with ``fullmatch`` now."""

from __future__ import annotations

import pytest

from gpu_worker.kvfs import InvalidArgument, Owner
from gpu_worker.kvfs.files import store_key, validate_tenant
from gpu_worker.kvfs.store import check_key
from gpu_worker.ops.errors import wire_error
from gpu_worker.protocol import ErrorCode
from tests.kvfs.memio import append, make_fs

A = Owner("acme", "s1")
B = Owner("bravo", "s1")
ENDINGS = ["\n"]  # "\r\n" and "\n\n" never matched "$"


@pytest.mark.parametrize("ending", ENDINGS)
def test_a_name_ending_in_a_newline_is_refused(tmp_path, ending):
    fs, io = make_fs(tmp_path)
    for call in (lambda: fs.create(A, "doc" + ending), lambda: fs.open(A, "doc" + ending)):
        with pytest.raises(InvalidArgument) as exc:
            call()
        assert wire_error(exc.value, "kv", "s").code == ErrorCode.BAD_ARGS
    assert fs.list_files("acme") == []
    # Another tenant's well-named file is unaffected.
    h = fs.create(B, "doc")
    append(fs, io, B, h, [1, 2, 3])
    fs.close(B, h)
    assert [(r.tenant, r.name, r.tokens) for r in fs.list_files()] == [("bravo", "doc", 3)]
    fs.check()


@pytest.mark.parametrize("ending", ENDINGS)
def test_tenant_ids_and_store_keys_ending_in_a_newline_are_refused(ending):
    with pytest.raises(InvalidArgument):
        validate_tenant("acme" + ending)
    with pytest.raises(InvalidArgument):
        store_key("acme", "doc" + ending)
    with pytest.raises(ValueError, match="invalid store key"):
        check_key("acme/doc.safetensors" + ending)
    assert store_key("acme", "doc") == check_key("acme/doc.safetensors")

"""secret_fingerprint: HMAC-SHA256 prefix, checked against the RFC 4231 test vectors."""

from __future__ import annotations

import pytest

from hush_hf.secrets import secret_fingerprint

KEY = bytes(range(32))


def test_matches_rfc_4231_hmac_sha256_vectors():
    # RFC 4231, test case 1 (20-byte key 0x0b..0b, data "Hi There") and test case 6 (131-byte key 0xaa).
    assert secret_fingerprint("Hi There", b"\x0b" * 20) == "b0344c61d8db3853"
    data = "Test Using Larger Than Block-Size Key - Hash Key First"
    assert secret_fingerprint(data, b"\xaa" * 131) == "60e431591ee0b67f"


def test_stable_key_dependent_and_name_dependent():
    first = secret_fingerprint("hunter2", KEY)
    assert first == secret_fingerprint("hunter2", bytearray(KEY))
    assert len(first) == 16 and all(c in "0123456789abcdef" for c in first)
    assert first != secret_fingerprint("hunter2", KEY[::-1])
    assert first != secret_fingerprint("hunter3", KEY)
    assert secret_fingerprint("ünïcode", KEY) != secret_fingerprint("unicode", KEY)


@pytest.mark.parametrize(
    ("name", "key", "message"),
    [
        ("hunter2", b"short", "key must hold at least 16 bytes, got 5"),
        ("hunter2", "a text key of many chars", "key must be bytes, got a str"),
        ("", KEY, "name must be a non-empty string"),
        (b"hunter2", KEY, "name must be a non-empty string"),
    ],
)
def test_errors_never_show_the_name(name, key, message):
    with pytest.raises(ValueError, match=message) as info:
        secret_fingerprint(name, key)
    assert "hunter2" not in str(info.value)

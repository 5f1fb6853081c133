"""safetensors (>= 0.8) ``save_file``/``load_file``/``safe_open`` and transformers
``save_pretrained``/``from_pretrained`` on a kvfs mount, next to a plain directory.
safetensors renames its temp file onto the final name while the file is still open; vLLM's
ExampleConnector and every ``save_pretrained`` write that way. Runs in kvfs's own
environment (the ``engines`` extra); see ``tools/engine_clients/safetensors_client.py``.
"""

from __future__ import annotations

import pytest

from support.engine_harness import assert_same, kv_dirs, need_client, run, without  # noqa: F401  (kv_dirs: fixture)


@pytest.mark.parametrize("part", ["safetensors", "transformers"])
def test_save_and_load_like_a_local_directory(kv_dirs, part):
    pytest.importorskip("safetensors")
    pytest.importorskip("transformers")
    client = need_client("safetensors")
    runs = {kind: without(run(client, "--dir", d / "st", "--part", part, where=kind)) for kind, d in kv_dirs.items()}
    plain = runs["plain"]
    steps = [k for k in plain if k not in ("tree", "bytes", "safetensors", "transformers")]
    # Every step succeeded on the plain directory: writers return None, checks True.
    assert steps and all(plain[k] in (None, True) or k == "listing" for k in steps), plain
    assert not [p for p in plain["tree"] if p.rsplit("/", 1)[-1].startswith(".tmp")]  # no temp file left
    if part == "transformers":
        assert plain["listing"] == ["config.json", "generation_config.json", "model.safetensors"]
    assert_same(runs["kvfs"], plain, f"{part} save/load")

"""Every config error names the field and the reason."""

import pytest

from kvfs.config import DiskConfig, DramConfig, PromoteMode, WriteMode, default_config, load_config, parse_config
from kvfs.errors import ConfigError

GOOD = {
    "tiers": [
        {"kind": "dram", "capacity": "64MiB"},
        {"kind": "disk", "name": "nvme", "capacity": "1GiB", "path": "/tmp/x"},
        {"kind": "s3", "bucket": "kvfs-bucket", "endpoint_url": "http://127.0.0.1:9"},
    ],
    "policy": {"eviction": "lfu", "promote": "second-hit"},
    "mount": {"allow_other": True, "negative_ttl": "500ms"},
}


def test_good_config():
    cfg = parse_config(GOOD)
    assert isinstance(cfg.tiers[0], DramConfig) and cfg.tiers[0].capacity == 64 << 20
    assert isinstance(cfg.tiers[1], DiskConfig) and cfg.tiers[1].name == "nvme"
    assert cfg.tiers[2].capacity is None and cfg.tiers[2].write is WriteMode.THROUGH
    assert cfg.policy.promote is PromoteMode.SECOND_HIT
    assert cfg.mount.negative_ttl == 0.5


def test_default_config():
    cfg = default_config()
    assert [t.kind.value for t in cfg.tiers] == ["dram", "disk"]
    assert cfg.tiers[0].capacity >= 256 << 20


def _with(**tier0):
    t = dict(GOOD["tiers"][1])
    t.update(tier0)
    return {"tiers": [t]}


@pytest.mark.parametrize(
    "data, field, reason",
    [
        ({}, "tiers", "at least one [[tiers]] entry is required"),
        ({"tiers": {"kind": "dram"}}, "tiers", "write tiers as [[tiers]] entries (an array of tables)"),
        ({"tiers": [{"capacity": "1GiB"}]}, "tiers[0].kind", "missing; one of dram, disk, posix, s3"),
        (
            {"tiers": [{"kind": "tape", "capacity": "1GiB"}]},
            "tiers[0].kind",
            "'tape' is not one of dram, disk, posix, s3",
        ),
        (
            {"tiers": [{"kind": "disk", "path": "/x"}]},
            "tiers[0].capacity",
            'missing required key (e.g. capacity = "4GiB")',
        ),
        (
            _with(capacity="4XB"),
            "tiers[0].capacity",
            "'4XB' is not a size; write bytes or a number with a unit (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)",
        ),
        (_with(capacity=0), "tiers[0].capacity", "must be larger than zero"),
        (_with(capacity="unlimited"), "tiers[0].capacity", 'only s3 tiers may be unlimited; give a size like "100GiB"'),
        (_with(path=None) | {"tiers": [{"kind": "disk", "capacity": "1GiB"}]}, "tiers[0].path", "missing required key"),
        (_with(write="sideways"), "tiers[0].write", "'sideways' is not one of 'back', 'through'"),
        (
            _with(colour="red"),
            "tiers[0].colour",
            "unknown key; known keys are capacity, concurrency, direct_io, fsync, name, path, timeout, write",
        ),
        (
            _with(timeout="soon"),
            "tiers[0].timeout",
            (
                "'soon' is not a duration; write seconds, or a number with a unit: ms, s, m, min, h, d "
                '(e.g. "250ms", "5s", "7d")'
            ),
        ),
        (_with(concurrency=0), "tiers[0].concurrency", "expected a positive whole number"),
        (_with(direct_io="yes"), "tiers[0].direct_io", "expected true or false"),
        (_with(name="a/b"), "tiers[0].name", "'a/b' is not a usable tier name (letters, digits, - and _)"),
        ({"tiers": [GOOD["tiers"][1], GOOD["tiers"][1]]}, "tiers[1].name", "tier name 'nvme' is used twice"),
        (
            {"tiers": [GOOD["tiers"][1], GOOD["tiers"][0]]},
            "tiers[1].kind",
            "a dram tier must be the first (hottest) tier",
        ),
        (
            {"tiers": [{"kind": "s3", "bucket": "ab"}]},
            "tiers[0].bucket",
            "S3 bucket names are at least 3 characters long",
        ),
        ({"tiers": GOOD["tiers"], "policy": {"eviction": "random"}}, "policy.eviction", None),
        (
            {"tiers": GOOD["tiers"], "policy": {"promote": "sometimes"}},
            "policy.promote",
            "'sometimes' is not one of 'always', 'second-hit', 'never'",
        ),
        (
            {"tiers": GOOD["tiers"], "mount": {"metrics_port": 70000}},
            "mount.metrics_port",
            "must be a TCP port number (0-65535)",
        ),
        (
            {"tiers": GOOD["tiers"], "mount": {"transport": "fast"}},
            "mount.transport",
            "'fast' is not one of 'auto', 'kernel', 'pyfuse3'",
        ),
        (
            {"tiers": GOOD["tiers"], "mounts": {}},
            "mounts",
            (
                "unknown top-level key (did you mean 'mount'?); "
                "expected [[tiers]], [policy], [mount], [client], [events], [[namespaces]] and [cluster]"
            ),
        ),
    ],
)
def test_config_errors(data, field, reason):
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    assert info.value.field == field
    if reason is not None:
        assert info.value.reason == reason
    assert str(info.value).startswith(f"config error in {field}: ")


def test_unknown_policy_lists_known():
    with pytest.raises(ConfigError, match=r"'random' is not one of .*lru"):
        parse_config({"tiers": GOOD["tiers"], "policy": {"eviction": "random"}})


def test_load_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="cannot read the config file"):
        load_config(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[[tiers]\nkind=")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)
    good = tmp_path / "good.toml"
    good.write_text('[[tiers]]\nkind = "dram"\ncapacity = "8MiB"\n')
    assert load_config(good).tiers[0].capacity == 8 << 20


def test_format_size_never_scientific():
    from kvfs.units import format_size

    assert [format_size(n) for n in (5, 1536, 1020 << 20, int(999.7 * 2**20), 3 << 40)] == [
        "5 B",
        "1.5 KiB",
        "1020 MiB",
        "1000 MiB",
        "3 TiB",
    ]


def test_relative_paths_are_made_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cfg = parse_config({"tiers": [{"kind": "disk", "capacity": "1GiB", "path": "data/disk"}]})
    assert cfg.tiers[0].path == tmp_path / "data" / "disk"  # the daemon runs in /, so no relative paths


def test_write_buffer_is_a_size_or_auto():
    assert parse_config({**GOOD, "mount": {"write_buffer": "2GiB"}}).mount.write_buffer == 2 << 30
    assert parse_config({**GOOD, "mount": {"write_buffer": "auto"}}).mount.write_buffer is None
    assert parse_config(GOOD).mount.write_buffer is None
    with pytest.raises(ConfigError) as info:
        parse_config({**GOOD, "mount": {"write_buffer": "1MiB"}})
    assert str(info.value).endswith('mount.write_buffer: must be at least 16MiB (or "auto")')


# -- a misspelled key is named, with the key it misspells (issue 24) ----------------------

NS = {"path": "tenant-a", "quota": {"nvme": "1GiB"}}
MODEL = {"model": "m", "dtype": "bf16", "num_layers": 2, "num_kv_heads": 2, "head_size": 64}


@pytest.mark.parametrize(
    "data, field, hint",
    [
        # a misspelled required key: named as unknown, never reported as the missing one
        ({"tiers": [{"kind": "dram", "capacty": "256MiB"}]}, "tiers[0].capacty", "'capacity'"),
        ({"tiers": [{"kind": "disk", "capacity": "1GiB", "pth": "/tmp/x"}]}, "tiers[0].pth", "'path'"),
        ({"tiers": [{"kind": "s3", "buckt": "kvfs-bucket"}]}, "tiers[0].buckt", "'bucket'"),
        ({"tiers": [{"kind": "dram", "capacity": "64MiB", "mlok": False}]}, "tiers[0].mlok", "'mlock'"),
        ({"tiers": [{"kind": "dram", "capacity": "64MiB", "knd": "dram"}]}, "tiers[0].knd", "'kind'"),
        ({"tiers": [{"knd": "dram", "capacity": "64MiB"}]}, "tiers[0].knd", "'kind'"),
        ({"tiers": GOOD["tiers"], "policy": {"evicton": "lru"}}, "policy.evicton", "'eviction'"),
        ({"tiers": GOOD["tiers"], "mount": {"allow_others": True}}, "mount.allow_others", "'allow_other'"),
        ({"tiers": GOOD["tiers"], "client": {"lease_tll": "10s"}}, "client.lease_tll", "'lease_ttl'"),
        ({"tiers": GOOD["tiers"], "events": {"zmg": "tcp://127.0.0.1:1"}}, "events.zmg", "'zmq'"),
        ({"tiers": GOOD["tiers"], "namespaces": [NS | {"quotas": {}}]}, "namespaces[0].quotas", "'quota'"),
        (
            {"tiers": GOOD["tiers"], "namespaces": [{"model": MODEL | {"num_layer": 2}}]},
            "namespaces[0].model.num_layer",
            "'num_layers'",
        ),
        ({"tiers": GOOD["tiers"], "polcy": {}}, "polcy", "'policy'"),
    ],
)
def test_an_unknown_key_is_named_with_the_key_it_misspells(data, field, hint):
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    assert info.value.field == field
    if hint is not None:
        assert f"(did you mean {hint}?)" in info.value.reason
        assert "unknown" in info.value.reason and "missing" not in info.value.reason


@pytest.mark.parametrize(
    "data, field, hint",
    [
        ({"tiers": [{"kind": "dramm", "capacity": "1GiB"}]}, "tiers[0].kind", "'dram'"),
        ({"tiers": [GOOD["tiers"][1] | {"write": "trough"}]}, "tiers[0].write", "'through'"),
        ({"tiers": GOOD["tiers"], "policy": {"eviction": "session-acr"}}, "policy.eviction", "'session-arc'"),
        (
            {"tiers": GOOD["tiers"], "namespaces": [NS | {"quota": {"nvm": "1GiB"}}]},
            "namespaces[0].quota.nvm",
            "'nvme'",
        ),
    ],
)
def test_an_unknown_value_of_a_closed_set_says_which_was_meant(data, field, hint):
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    assert info.value.field == field
    assert f"(did you mean {hint}?)" in info.value.reason


def test_a_key_like_no_other_gets_no_guess():
    with pytest.raises(ConfigError) as info:
        parse_config({"tiers": [{"kind": "dram", "capacity": "1GiB", "xyzzy": 1}]})
    assert (
        info.value.reason
        == "unknown key; known keys are capacity, concurrency, mlock, name, path, prefault, timeout, write"
    )


def test_a_loaded_config_says_where_it_came_from(tmp_path):
    good = tmp_path / "good.toml"
    good.write_text('[[tiers]]\nkind = "dram"\ncapacity = "8MiB"\n')
    assert load_config(good).origin == str(good)
    assert default_config().origin.startswith("the embedded default: dram ")

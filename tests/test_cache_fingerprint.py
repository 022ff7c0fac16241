import os
import shutil

import pytest
from cache_toy import identity

from ovpool.cache.fingerprint import DeviceKey, GraphIdentity, fingerprint, ports_key
from ovpool.cache.sources import ContentHashes
from ovpool.cache.store import CacheStore
from ovpool.settings import Settings

CPU = DeviceKey("CPU", "intel64 avx2")


def fp(ident, device=CPU, config=None, version="2026.4", content=None):
    return fingerprint(ident, device, config or {}, ov_version=version, content_hash=content)


@pytest.fixture
def model_file(tmp_path):
    path = tmp_path / "m.gguf"
    path.write_bytes(os.urandom(4096))
    return path


def test_same_inputs_same_family_and_each_part_changes_it(model_file):
    base = fp(identity(model_file))
    assert fp(identity(model_file)).family == base.family
    changed = [fp(identity(model_file, {"kv_cache_precision": "u8"})),
               fp(identity(model_file), device=DeviceKey("GPU", "xe")),
               fp(identity(model_file), config={"INFERENCE_PRECISION_HINT": "bf16"}),
               fp(identity(model_file), version="2026.5")]
    assert len({base.family, *(c.family for c in changed)}) == 5


def test_ports_select_an_entry_not_a_family(model_file):
    assert fp(identity(model_file, extra=True)).family == fp(identity(model_file)).family
    assert ports_key(identity(model_file, extra=True).ports) != ports_key(identity(model_file).ports)


def test_explicit_default_setting_fingerprints_like_unset(model_file):
    unset = Settings.resolve({}, env={}).graph_values()
    defaults = {"attention": "auto", "stateful": "on", "q4_storage": "auto"}
    explicit = Settings.resolve(defaults, env={}).graph_values()
    assert fp(identity(model_file, unset)).family == fp(identity(model_file, explicit)).family


def test_touched_replaced_or_copied_gguf_changes_the_family(model_file, tmp_path):
    before = fp(identity(model_file)).family
    os.utime(model_file, ns=(1, 1))
    assert fp(identity(model_file)).family != before
    touched = fp(identity(model_file)).family
    copy = tmp_path / "copy.gguf"
    shutil.copy2(model_file, copy)
    assert fp(identity(copy)).family != touched
    os.replace(copy, model_file)
    assert fp(identity(model_file)).family != touched


def test_content_identity_follows_a_copy_and_hashes_once(model_file, tmp_path):
    hashes = ContentHashes(CacheStore(tmp_path / "cache"))
    ident = GraphIdentity(**{**vars(identity(model_file)), "source_identity": "content"})
    copy = tmp_path / "elsewhere.gguf"
    shutil.copy(model_file, copy)
    ident_copy = GraphIdentity(**{**vars(ident), "sources": [(str(copy), ident.sources[0][1])]})
    assert fp(ident, content=hashes).family == fp(ident_copy, content=hashes).family
    remembered = hashes._load()
    assert len(remembered) == 2 and len(set(remembered.values())) == 1
    model_file.write_bytes(os.urandom(4096))
    assert fp(ident, content=hashes).family != fp(ident_copy, content=hashes).family


class FakeCore:
    def __init__(self, props):
        self.props = props

    def get_property(self, device, name):
        if (device, name) not in self.props:
            raise RuntimeError(f"{device} has no {name}")
        return self.props[(device, name)]


def test_device_index_does_not_enter_the_key():
    core = FakeCore({("GPU.0", "DEVICE_ARCHITECTURE"): "GPU: vendor=0x8086 arch=v12.71.4",
                     ("GPU.1", "DEVICE_ARCHITECTURE"): "GPU: vendor=0x8086 arch=v12.71.4",
                     ("GPU.2", "FULL_DEVICE_NAME"): "Intel Arc B580"})
    assert DeviceKey.probe(core, "GPU.0") == DeviceKey.probe(core, "GPU.1")
    assert DeviceKey.probe(core, "GPU.2") == DeviceKey("GPU", "Intel Arc B580")

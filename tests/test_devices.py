"""The device type of an OpenVINO device string, as the cache and the worker both read it."""

import pytest

from ovpool.devices import device_type


@pytest.mark.parametrize(("device", "kind"), [("CPU", "CPU"), ("cpu", "CPU"), ("GPU.1", "GPU"),
                                              ("GPU.0.1", "GPU"), ("NPU", "NPU"),
                                              ("HETERO:GPU.1,CPU", "HETERO"), ("AUTO:GPU", "AUTO")])
def test_device_type_drops_the_index_and_names_a_virtual_device_itself(device, kind):
    assert device_type(device) == kind

"""The device type of an OpenVINO device string, as the cache and the worker both read it, and
the check that OpenVINO can open a device before anything is built on it."""

import openvino as ov
import pytest
from cli_run import clean_error, ovpool

from ovpool.devices import check_usable, device_type


@pytest.mark.parametrize(("device", "kind"), [("CPU", "CPU"), ("cpu", "CPU"), ("GPU.1", "GPU"),
                                              ("GPU.0.1", "GPU"), ("NPU", "NPU"),
                                              ("HETERO:GPU.1,CPU", "HETERO"), ("AUTO:GPU", "AUTO")])
def test_device_type_drops_the_index_and_names_a_virtual_device_itself(device, kind):
    assert device_type(device) == kind


@pytest.mark.parametrize("device", ["FOO", "GPU.77", "cpu"])
def test_a_device_openvino_cannot_open_is_one_line_naming_it_and_those_it_sees(tiny_model, device):
    """It used to be the plugin's RuntimeError, a traceback from the first compile."""
    result = ovpool("generate", "--model", str(tiny_model()), "--device", device, "--max-tokens", "1", "hi")
    error = clean_error(result, f"error: device {device!r} cannot be opened here (",
                        f"); OpenVINO sees {', '.join(ov.Core().available_devices)}: pass one of them")
    assert len(error.strip().splitlines()) == 1


def test_real_and_virtual_devices_pass_the_check():
    core = ov.Core()
    for device in ["CPU", "AUTO", "HETERO:CPU", *core.available_devices]:
        check_usable(core, device)

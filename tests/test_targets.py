"""Device profiles: every built-in loads, cites its figures, and costs like the POET model says."""

import json
import math
from pathlib import Path

import pytest

import edgetrain.targets as targets
from edgetrain.targets import (FAMILIES, Target, TargetProfileError, UnknownTargetError, list_boards, list_targets,
                               load_target)

BUILTINS = [
    "host", "jetson-agx-orin", "jetson-nano", "jetson-orin-nano", "jetson-orin-nx", "jetson-tx2", "jetson-xavier-nx",
    "mkr1000", "mps2-an386", "nrf52840", "rpi4",
]
MB = 1e6  # the POET reference code's MB/s are decimal megabytes


def test_list_targets_names_every_profile():
    assert list_targets() == sorted(BUILTINS)


@pytest.mark.parametrize("name", BUILTINS)
def test_builtin_loads_and_is_consistent(name):
    t = load_target(name)
    assert isinstance(t, Target) and t.name == name
    assert t.family in FAMILIES
    for fld in targets.loader.FIGURE_FIELDS:
        value = getattr(t, fld)
        assert math.isfinite(value) and value >= 0, fld
        assert t.sources[fld].strip(), f"{name}: {fld} cites no source"
    assert isinstance(t.ram_bytes, int) and t.ram_bytes > 0
    json.loads(json.dumps(t.to_dict()))  # JSON-able
    assert t.to_dict()["sources"] == dict(t.sources)


@pytest.mark.parametrize("name", ["jetson-nano", "jetson-xavier-nx", "jetson-agx-orin", "jetson-orin-nano",
                                  "jetson-orin-nx"])
def test_jetson_figures_say_they_are_public_specs(name):
    t = load_target(name)
    assert "public spec" in t.sources["flops_per_s"].lower()


def test_mkr1000_costs_match_the_poet_reference():
    t = load_target("mkr1000")
    assert t.ram_bytes == 32 * 1024
    assert t.page_in_time_s(1e6) == pytest.approx(0.109e-3 + 1e6 / (4.6165 * MB), rel=1e-12)
    assert t.page_out_time_s(1e6) == pytest.approx(0.113e-3 + 1e6 / (4.44 * MB), rel=1e-12)
    assert t.page_in_energy_j(1e6) == pytest.approx((0.109e-3 + 1e6 / (4.6165 * MB)) * 0.33, rel=1e-12)
    assert t.page_out_energy_j(1e6) == pytest.approx((0.113e-3 + 1e6 / (4.44 * MB)) * 0.33, rel=1e-12)
    assert t.compute_time_s(1.667e5) == pytest.approx(1.0)
    assert t.compute_energy_j(2.525e6) == pytest.approx(1.0)


@pytest.mark.parametrize(
    "name, flops_s, flops_j, pin, pout, power",
    [
        ("nrf52840", 6.37e6, 5.80e8, (0.109e-3, 4.6165 * MB), (0.113e-3, 4.44 * MB), 0.33),
        ("rpi4", 2e9, 4.012e7, (0.0051e-3, 45.5 * MB), (0.0185e-3, 24.5 * MB), 0.15),
        ("jetson-tx2", None, None, (0.54e-3, 108.5 * MB), (2.396e-3, 94.37 * MB), 0.309),
        ("mps2-an386", 6.37e6, 5.80e8, (0.109e-3, 4.6165 * MB), (0.113e-3, 4.44 * MB), 0.33),
    ],
)
def test_poet_reference_figures(name, flops_s, flops_j, pin, pout, power):
    t = load_target(name)
    if flops_s is not None:
        assert t.flops_per_s == flops_s and t.flops_per_joule == flops_j
    assert (t.page_in_latency_s, t.page_in_bandwidth_bytes_per_s) == pytest.approx(pin)
    assert (t.page_out_latency_s, t.page_out_bandwidth_bytes_per_s) == pytest.approx(pout)
    assert t.memory_power_w == power
    n = 12345
    assert t.page_in_time_s(n) == pytest.approx(pin[0] + n / pin[1])
    assert t.page_out_energy_j(n) == pytest.approx((pout[0] + n / pout[1]) * power)


def test_rpi4_notes_the_flops_discrepancy():
    assert "1.2035e8" in load_target("rpi4").sources["flops_per_s"]


def test_mps2_an386_is_the_qemu_board():
    t = load_target("mps2-an386")
    assert t.ram_bytes == 4 * 1024 * 1024 and t.family == "mcu"


def test_zero_bytes_cost_nothing_and_negative_is_an_error():
    t = load_target("mkr1000")
    assert t.page_in_time_s(0) == 0.0 and t.page_out_energy_j(0) == 0.0
    with pytest.raises(ValueError):
        t.page_in_time_s(-1)
    with pytest.raises(ValueError):
        t.compute_energy_j(-1)


def test_host_is_measured():
    t = load_target("host")
    assert t.measured and t.family == "host"
    assert t.ram_bytes > 256 * 1024 * 1024
    assert t.flops_per_s > 1e8  # any machine that runs the tests beats a microcontroller by far
    assert t.storage_bytes > 0
    assert load_target("host") == t  # measured once per process


def test_target_is_frozen_and_hashable():
    t = load_target("rpi4")
    with pytest.raises(AttributeError):
        t.ram_bytes = 1  # type: ignore[misc]
    with pytest.raises(TypeError):
        t.sources["ram_bytes"] = "x"  # type: ignore[index]
    assert hash(t) == hash(load_target("rpi4"))


def test_unknown_target_lists_known_names():
    with pytest.raises(UnknownTargetError) as err:
        load_target("nope")
    assert isinstance(err.value, ValueError)
    for name in BUILTINS:
        assert name in str(err.value)


def test_load_target_passes_a_target_through():
    t = load_target("rpi4")
    assert load_target(t) is t


# -- user profiles --------------------------------------------------------------------------


def _profile_text(**overrides) -> str:
    """The rpi4 profile with fields replaced (value None deletes the line)."""
    lines = []
    for line in (Path(targets.__file__).parent / "profiles" / "rpi4.toml").read_text().splitlines():
        key = line.split("=", 1)[0].strip()
        if key in overrides and not line.startswith(" ") and "[sources]" not in lines:
            if overrides[key] is not None:
                lines.append(f"{key} = {overrides[key]}")
            continue
        lines.append(line)
    return "\n".join(lines) + "\n"


def _write(tmp_path, text, name="custom.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_custom_profile_by_path(tmp_path):
    path = _write(tmp_path, _profile_text(name='"my-board"', ram_bytes="1_000_000"))
    t = load_target(path)
    assert t.name == "my-board" and t.ram_bytes == 1_000_000 and t.path == str(path)
    assert load_target(str(path)) == t


def test_missing_field_is_named(tmp_path):
    path = _write(tmp_path, _profile_text(page_out_latency_s=None))
    with pytest.raises(TargetProfileError) as err:
        load_target(path)
    assert "'page_out_latency_s' is missing" in str(err.value) and str(path) in str(err.value)


def test_missing_source_is_named(tmp_path):
    text = "\n".join(
        line for line in _profile_text().splitlines()
        if not line.startswith("memory_power_w = \"")
    )
    with pytest.raises(TargetProfileError, match=r"sources\.memory_power_w"):
        load_target(_write(tmp_path, text))


@pytest.mark.parametrize(
    "override, field",
    [
        ({"family": '"gpu"'}, "family"),
        ({"ram_bytes": "1.5"}, "ram_bytes"),
        ({"ram_bytes": "true"}, "ram_bytes"),
        ({"flops_per_s": "0"}, "flops_per_s"),
        ({"memory_power_w": '"lots"'}, "memory_power_w"),
        ({"page_in_bandwidth_bytes_per_s": "-1"}, "page_in_bandwidth_bytes_per_s"),
        ({"flops_per_s": '"measured"'}, "flops_per_s"),  # only a measured profile may say so
        ({"ram_byts": "5"}, "ram_byts"),  # typo: unknown field
        ({"cpu_threads": "0"}, "cpu_threads"),
        ({"cpu_threads": "2.5"}, "cpu_threads"),
        ({"cpu_threads": "true"}, "cpu_threads"),
    ],
)
def test_bad_values_name_the_field(tmp_path, override, field):
    text = _profile_text(**override)
    if "ram_byts" in override:
        text = text.replace("[sources]", "ram_byts = 5\n[sources]")
    with pytest.raises(TargetProfileError, match=field):
        load_target(_write(tmp_path, text))


def test_cpu_threads_is_optional_cited_and_carried_into_schedules(tmp_path):
    """A profile without a thread count trains on one thread; one that names it cites it, and the figure travels
    in the target a schedule embeds (a profile without it serialises as it always has)."""
    rpi4 = load_target("rpi4")
    assert rpi4.cpu_threads == 4 and rpi4.to_dict()["cpu_threads"] == 4 and "cpu_threads" in rpi4.sources
    assert Target(**rpi4.to_dict()) == rpi4
    plain = load_target(_write(tmp_path, "\n".join(line for line in _profile_text(cpu_threads=None).splitlines()
                                                    if not line.startswith("cpu_threads = \""))))
    assert plain.cpu_threads == 1 and "cpu_threads" not in plain.to_dict()
    from edgetrain.runtime.python.threads import PLAN_THREADS

    assert plain.cpu_threads == PLAN_THREADS  # the runtime's count for a plan that names none is the same
    uncited = "\n".join(line for line in _profile_text().splitlines() if not line.startswith("cpu_threads = \""))
    with pytest.raises(TargetProfileError, match=r"sources\.cpu_threads"):
        load_target(_write(tmp_path, uncited, "uncited.toml"))


def test_invalid_toml_names_the_file(tmp_path):
    path = _write(tmp_path, "name = \n")
    with pytest.raises(TargetProfileError, match="custom.toml"):
        load_target(path)


def test_missing_file(tmp_path):
    with pytest.raises(TargetProfileError, match="no such"):
        load_target(tmp_path / "absent.toml")


def test_zero_latency_is_allowed(tmp_path):
    t = load_target(_write(tmp_path, _profile_text(page_in_latency_s="0")))
    assert t.page_in_time_s(45.5e6) == pytest.approx(1.0)


def test_targets_imports_no_other_stage():
    import subprocess
    import sys

    code = (
        "import sys; import edgetrain.targets as targets; targets.load_target('rpi4'); "
        "bad = [m for m in sys.modules if m.startswith(('edgetrain.compiler', 'edgetrain.codegen', 'edgetrain.runtime'))]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(targets.__file__).parent.parent)


def test_jetsons_train_on_their_gpu_the_others_on_cpu_cores():
    """A Jetson's plans train on its CUDA GPU (their graph is traced with kernels a GPU runs); every other
    family's on its CPU."""
    for name in list_targets():
        t = load_target(name)
        assert t.gpu is (t.family == "jetson"), name
    assert load_target("jetson-nano").gpu and not load_target("rpi4").gpu


# -- boards: data in targets/boards/, code in runtime/c/port/ -----------------------------------------------

def _link_script(board) -> dict:
    """The memory a port's link script gives the image: {region: (origin, bytes)} and its minimum stack."""
    import re

    text = (Path(__file__).resolve().parents[1] / "runtime" / "c" / "port" / board.port / "link.ld").read_text()
    regions = {m[0]: (int(m[1], 16), int(m[2]) * 1024)
               for m in re.findall(r"(\w+)\s*\(\w+\)\s*:\s*ORIGIN\s*=\s*(0x[0-9A-Fa-f]+),\s*LENGTH\s*=\s*(\d+)K", text)}
    return {"regions": regions, "stack": int(re.search(r"_min_stack\s*=\s*(\d+)K;", text)[1]) * 1024}


@pytest.mark.parametrize("name", list_boards())
def test_a_board_is_its_port_and_its_link_script_says_what_it_says(name):
    """Each board's figures are the ones its port's link script links with (a test that fails when they part),
    and its port has the startup code the Makefile builds."""
    from edgetrain.targets import load_board

    b = load_board(name)
    port = Path(__file__).resolve().parents[1] / "runtime" / "c" / "port" / b.port
    assert (port / "startup.c").exists() and (port / "link.ld").exists()
    ld = _link_script(b)
    assert ld["regions"] == {"FLASH": (b.flash_origin, b.flash_bytes), "RAM": (b.ram_origin, b.ram_bytes)}
    assert ld["stack"] == b.stack_bytes
    assert b.instructions_per_tick * b.timer_hz == 1_000_000_000


def test_a_target_names_a_known_board_or_none(tmp_path):
    from edgetrain.targets import DEFAULT_BOARD, board_of

    for name in list_targets():
        if name != "host":
            assert board_of(load_target(name)).name == (load_target(name).board or DEFAULT_BOARD)
    assert "board" not in load_target("nrf52840").to_dict()  # schedules of a default board are as they were
    src = (Path(__file__).resolve().parents[1] / "targets" / "profiles" / "nrf52840.toml").read_text()
    bad = tmp_path / "bad.toml"
    bad.write_text(src.replace('family = "mcu"', 'family = "mcu"\nboard = "no-such-board"'))
    with pytest.raises(TargetProfileError, match="board"):
        load_target(str(bad))
    good = tmp_path / "good.toml"
    good.write_text(src.replace('family = "mcu"', f'family = "mcu"\nboard = "{DEFAULT_BOARD}"'))
    t = load_target(str(good))
    assert t.board == DEFAULT_BOARD and t.to_dict()["board"] == DEFAULT_BOARD and Target(**t.to_dict()) == t

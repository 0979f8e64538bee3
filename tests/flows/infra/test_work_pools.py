"""Pool choice and device placement: GPU pool only with a live GPU worker and GPU slots."""

from __future__ import annotations

from flows.infra.work_pools import CPU_SLOT, choose_pool, gpu_devices, place


def test_cpu_pool_unless_a_gpu_worker_is_up_and_gpus_are_declared():
    assert choose_pool(gpu_pool_ready=False, gpu_devices=[0, 1]) == "cpu"
    assert choose_pool(gpu_pool_ready=True, gpu_devices=[]) == "cpu"
    assert choose_pool(gpu_pool_ready=True, gpu_devices=[0]) == "gpu"


def test_gpu_devices_come_from_gpu_slots_only():
    assert gpu_devices(["gpu-1", "train-cpu", "gpu-0", "gpu-x", "mygpu-3", "gpu-10"]) == [0, 1, 10]


def test_cpu_placement_hides_the_gpus_and_holds_a_cpu_slot():
    placements = place(3, gpu_pool_ready=False, devices=[0])
    assert {p.pool for p in placements} == {"cpu"}
    assert {p.deployment for p in placements} == {"train-run-cpu"}
    assert all(p.slot == CPU_SLOT and p.env == {"CUDA_VISIBLE_DEVICES": ""} for p in placements)


def test_gpu_placement_round_robin_one_slot_per_device():
    placements = place(5, gpu_pool_ready=True, devices=[0, 3])
    assert [p.env["CUDA_VISIBLE_DEVICES"] for p in placements] == ["0", "3", "0", "3", "0"]
    assert [p.slot for p in placements] == ["gpu-0", "gpu-3", "gpu-0", "gpu-3", "gpu-0"]
    assert {p.deployment for p in placements} == {"train-run-gpu"}
    assert placements[1].job_variables == {"env": {"CUDA_VISIBLE_DEVICES": "3"}}


def test_container_pools_get_no_device_index_the_scheduler_assigns_it():
    placements = place(3, gpu_pool_ready=True, devices=[0, 1], pin_devices=False)
    assert [p.env for p in placements] == [{}, {}, {}]
    assert [p.slot for p in placements] == ["gpu-0", "gpu-1", "gpu-0"]  # still at most one per slot

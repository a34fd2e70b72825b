from aleph.env.cgroup import format_bytes, read_envelope


def _v2(tmp_path, mem="110999998464", cpu="1785000 100000", cpuset="0-23,48-71"):
    (tmp_path / "cgroup.controllers").write_text("cpu memory cpuset\n")
    (tmp_path / "memory.max").write_text(mem + "\n")
    (tmp_path / "cpu.max").write_text(cpu + "\n")
    (tmp_path / "cpuset.cpus.effective").write_text(cpuset + "\n")
    return tmp_path


def test_v2_seed_envelope(tmp_path):
    env = read_envelope(_v2(tmp_path))
    assert env.version == 2
    assert env.memory_limit_bytes == 110_999_998_464
    assert env.cpu_cores == 17.85
    assert (env.cpu_quota_us, env.cpu_period_us) == (1785000, 100000)
    assert env.cpuset == "0-23,48-71"
    assert format_bytes(env.memory_limit_bytes) == "110,999,998,464 B (103.38 GiB)"


def test_v2_unlimited(tmp_path):
    env = read_envelope(_v2(tmp_path, mem="max", cpu="max 100000"))
    assert env.memory_limit_bytes is None
    assert env.cpu_cores is None


def test_v1_seed_envelope(tmp_path):
    (tmp_path / "memory").mkdir()
    (tmp_path / "memory" / "memory.limit_in_bytes").write_text("110999998464\n")
    (tmp_path / "cpu,cpuacct").mkdir()
    (tmp_path / "cpu,cpuacct" / "cpu.cfs_quota_us").write_text("1785000\n")
    (tmp_path / "cpu,cpuacct" / "cpu.cfs_period_us").write_text("100000\n")
    env = read_envelope(tmp_path)
    assert env.version == 1
    assert env.memory_limit_bytes == 110_999_998_464
    assert env.cpu_cores == 17.85


def test_v1_unlimited(tmp_path):
    (tmp_path / "memory").mkdir()
    (tmp_path / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    env = read_envelope(tmp_path)
    assert env.memory_limit_bytes is None and env.cpu_cores is None


def test_no_cgroup(tmp_path):
    env = read_envelope(tmp_path)
    assert env.version is None and env.memory_limit_bytes is None


def test_malformed_cgroup_value_names_the_file(tmp_path):
    import pytest

    from aleph.errors import ConfigError

    with pytest.raises(ConfigError, match=r"memory\.max: '12 GB' is not an integer"):
        read_envelope(_v2(tmp_path, mem="12 GB"))


def test_v1_reads_the_own_cgroup_below_the_mount_and_the_lowest_ancestor_limit(tmp_path):
    """A host or job runner mounts the whole v1 hierarchy: the process's own directory
    (from /proc/self/cgroup) holds its limit; hierarchical_memory_limit is the binding one."""
    own = tmp_path / "memory" / "jobs" / "j1"
    own.mkdir(parents=True)
    (tmp_path / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    (own / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    (own / "memory.stat").write_text("cache 0\nhierarchical_memory_limit 1258291200\n")
    cpu = tmp_path / "cpu" / "jobs" / "j1"
    cpu.mkdir(parents=True)
    (cpu / "cpu.cfs_quota_us").write_text("200000\n")
    (cpu / "cpu.cfs_period_us").write_text("100000\n")
    text = "5:cpu:/jobs/j1\n4:memory:/jobs/j1\n"
    env = read_envelope(tmp_path, self_cgroup=text)
    assert (env.memory_limit_bytes, env.cpu_cores) == (1_258_291_200, 2.0)
    # a container's own namespace: the named path does not exist below the mount
    assert read_envelope(tmp_path, self_cgroup="4:memory:/docker/abc\n").memory_limit_bytes is None

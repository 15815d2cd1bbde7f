"""Several hosts: JAX's multi-controller runtime (one process per host, all running c2.main).

`initialize` starts `jax.distributed` from explicit settings (flags or environment) or, with none,
from the cluster (Slurm, Open MPI, TPU). Every process then sees every device in `jax.devices()`,
so the mesh of c2/sharding.py spans all of them; each process feeds and reads only its own
devices. Process 0 is the primary: it writes records and metrics and, in RL, runs the rollouts;
the others compute with it. The helpers here are the few places where processes exchange Python
data: `share` (process 0's object to everyone), `allgather` (every process's object to
everyone; never the weights, whose shards each process publishes itself,
c2/rl/weight_sync.py), `process_rows` (which rows of a global batch this process's devices
hold), and `Channel` (ordered messages from process 0 to the others through the coordination
service, off the devices: what a multi-host engine's leader tells its followers,
c2/infer/lockstep.py).
"""

from __future__ import annotations

import itertools
import os
import pickle
from collections.abc import Mapping

import jax
import numpy as np

# Settings read from the environment when the flags leave them unset (JAX's own names).
ENV = {
    "coordinator_address": "JAX_COORDINATOR_ADDRESS",
    "num_processes": "JAX_NUM_PROCESSES",
    "process_id": "JAX_PROCESS_ID",
}


# The flag giving a process its simulated CPU devices.
DEVICE_FLAG = "--xla_force_host_platform_device_count"


def cpu_xla_flags(devices: int | None) -> str:
    """XLA_FLAGS for a process started from this one: this process's flags with the CPU device
    count replaced by `devices` (None: XLA's default, one)."""
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if not f.startswith(DEVICE_FLAG)]
    return " ".join([*flags, *([f"{DEVICE_FLAG}={devices}"] if devices else [])])


def settings(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    environ: Mapping[str, str] | None = None,
) -> dict:
    """The explicit settings (arguments first, then JAX_* environment variables), checked.

    Either none is given (the cluster supplies them) or all three are; a ValueError names what is
    wrong otherwise.
    """
    environ = os.environ if environ is None else environ
    given = {
        "coordinator_address": coordinator_address,
        "num_processes": num_processes,
        "process_id": process_id,
    }
    for name, value in given.items():
        if value is None and environ.get(ENV[name], "") != "":
            value = environ[ENV[name]]
            if name != "coordinator_address":
                try:
                    value = int(value)
                except ValueError:
                    raise ValueError(f"{ENV[name]}={value!r}: expected an int") from None
            given[name] = value
    missing = [n for n, v in given.items() if v is None]
    if len(missing) == 3:
        return {}
    if missing:
        have = ", ".join(f"{n}={v!r}" for n, v in given.items() if v is not None)
        raise ValueError(
            f"distributed settings: {have} given but not {missing} (give coordinator_address, "
            f"num_processes and process_id together, as flags --{' --'.join(missing)} or "
            f"{', '.join(ENV[m] for m in missing)}; or none of them on a cluster JAX detects)"
        )
    address, n, i = given["coordinator_address"], given["num_processes"], given["process_id"]
    if not isinstance(address, str) or not address.rpartition(":")[2].isdigit():
        raise ValueError(f"coordinator_address={address!r}: expected HOST:PORT")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"num_processes={n!r}: expected a positive int")
    if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n:
        raise ValueError(f"process_id={i!r}: expected an int in [0, num_processes={n})")
    return given


def initialize(**kwargs) -> None:
    """`jax.distributed.initialize` with `settings(**kwargs)`; call before any JAX computation.

    On CPU the collectives between processes go through gloo (the CPU backend has no others).
    """
    chosen = settings(**kwargs)
    if getattr(jax.config, "jax_cpu_collectives_implementation", "gloo") in (None, "none"):
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(**chosen)


def is_primary() -> bool:
    return jax.process_index() == 0


def share(obj=None):
    """Process 0's `obj` on every process (others pass anything; it is ignored). Every process
    must call it at the same point: it is a collective. One process: `obj` itself."""
    if jax.process_count() == 1:
        return obj
    from jax.experimental import multihost_utils

    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL) if is_primary() else b""
    size = multihost_utils.broadcast_one_to_all(np.asarray([len(data)], np.int64))
    size = int(np.asarray(size)[0])
    buffer = np.zeros(size, np.uint8)
    if is_primary():
        buffer[:] = np.frombuffer(data, np.uint8)
    buffer = np.asarray(multihost_utils.broadcast_one_to_all(buffer))
    return obj if is_primary() else pickle.loads(buffer.tobytes())


def allgather(obj) -> list:
    """Every process's `obj` (small Python data: never weights), in process order; a collective
    every process calls at the same point. One process: [obj]."""
    if jax.process_count() == 1:
        return [obj]
    from jax.experimental import multihost_utils

    data = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)
    sizes = np.asarray(multihost_utils.process_allgather(np.asarray([data.size], np.int64)))
    buffer = np.zeros(int(sizes.max()), np.uint8)
    buffer[: data.size] = data
    gathered = np.asarray(multihost_utils.process_allgather(buffer))
    return [pickle.loads(gathered[i, : int(n)].tobytes()) for i, n in enumerate(sizes.reshape(-1))]


def process_rows(batch_sharding: jax.sharding.Sharding, shape: tuple[int, ...]) -> tuple[int, int]:
    """(index, count): this process's devices hold rows [index * B / count, (index + 1) * B /
    count) of a [B, ...] array laid out by `batch_sharding` (count 1: every row, as when the batch
    is replicated over processes). A ValueError where they are not one such block."""
    B = shape[0]
    rows = set()
    for index in batch_sharding.addressable_devices_indices_map(tuple(shape)).values():
        rows.update(range(B)[index[0]] if index else range(B))
    lo, hi = min(rows), max(rows) + 1
    n = hi - lo
    if len(rows) != n or B % n or lo % n:
        raise ValueError(
            f"process {jax.process_index()}: its devices hold rows {sorted(rows)[:8]}... of a "
            f"batch of {B}, not one of {B // max(n, 1)} equal blocks (order the mesh's devices by "
            "process)"
        )
    return lo // n, B // n


def _client():
    """The coordination service's client (its key-value store and barriers)."""
    from jax._src import distributed as jax_distributed  # the client jax's own serialisation uses

    client = jax_distributed.global_state.client
    if client is None:
        raise RuntimeError("jax.distributed is not initialized: call c2.distributed.initialize")
    return client


class Channel:
    """Ordered Python messages from process 0 to the others through the coordination service's
    key-value store (host to host: no device collective, no compiled program). `send` (process
    0) pickles a message once per receiver under the key `c2/<name>/<rank>/<n>`; `receive`
    (another process) waits for its next key, deletes it (the store holds only the messages in
    flight) and returns the message, or None when `timeout_s` passes first. `post` / `peek`
    keep one overwritable value under `c2/<name>/<key>` (a hint a receiver polls). Messages of
    one channel arrive in the order they were sent. `processes`: the group's size (default:
    jax.process_count()). `client`: the store (default: this process's jax.distributed client);
    anything with its key_value_* methods works."""

    def __init__(self, name: str, processes: int | None = None, client=None):
        self.name, self._client = name, client
        self.receivers = range(1, jax.process_count() if processes is None else processes)
        self._sent = self._received = 0

    @property
    def client(self):
        if self._client is None:
            self._client = _client()
        return self._client

    def send(self, message) -> None:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        for rank in self.receivers:
            self.client.key_value_set_bytes(f"c2/{self.name}/{rank}/{self._sent}", data)
        self._sent += 1

    def receive(self, timeout_s: float, rank: int | None = None):
        rank = jax.process_index() if rank is None else rank
        key = f"c2/{self.name}/{rank}/{self._received}"
        try:
            data = self.client.blocking_key_value_get_bytes(key, max(1, int(timeout_s * 1000)))
        except Exception as e:  # the service's DEADLINE_EXCEEDED comes as a plain error
            if "DEADLINE_EXCEEDED" in str(e) or "timed out" in str(e).lower():
                return None
            raise
        self.client.key_value_delete(key)
        self._received += 1
        return pickle.loads(data)

    def post(self, key: str, value) -> None:
        data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        self.client.key_value_set_bytes(f"c2/{self.name}/{key}", data, allow_overwrite=True)

    def peek(self, key: str):
        """The value last posted under `key`, or None."""
        try:
            data = self.client.key_value_try_get_bytes(f"c2/{self.name}/{key}")
        except Exception as e:
            if "NOT_FOUND" in str(e) or "not found" in str(e).lower():
                return None
            raise
        return pickle.loads(data)


_barriers = 0  # barriers passed by this process (each name is used once)


def barrier(name: str, timeout_s: float = 600.0) -> None:
    """Waits until every process reaches `name` (the coordination service's barrier, not a
    device collective); nothing with one process."""
    if jax.process_count() == 1:
        return
    global _barriers
    _barriers += 1
    _client().wait_at_barrier(f"{name} #{_barriers}", int(timeout_s * 1000))


def _prime_factors(n: int) -> list[int]:
    out, p = [], 2
    while n > 1:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return out


def warm_collectives(mesh: jax.sharding.Mesh) -> None:
    """Sets up the CPU (gloo) communicators of every group of devices a program on `mesh` can
    reduce over, with all processes in step.

    gloo connects a group the first time a program uses it and gives its peers 30 s to arrive:
    processes that compile a new program at different speeds (a loaded machine) miss that window.
    Every group made of whole or prime-factored mesh axes is connected here, once, after a
    barrier; later programs reuse the connections (a collective itself waits as long as it
    takes). Nothing with one process or on GPU/TPU.
    """
    if jax.process_count() == 1 or mesh.devices.flat[0].platform != "cpu":
        return
    sizes = [f for n in mesh.devices.shape for f in _prime_factors(n)]
    if not sizes:
        return
    names = tuple(f"f{i}" for i in range(len(sizes)))
    fine = jax.sharding.Mesh(mesh.devices.reshape(sizes), names)
    groups = [c for k in range(1, len(names) + 1) for c in itertools.combinations(names, k)]
    spec = jax.sharding.PartitionSpec(names)

    def body(x):
        return [jax.lax.psum(x, group) for group in groups]

    fn = jax.jit(jax.shard_map(body, mesh=fine, in_specs=spec, out_specs=[spec] * len(groups)))
    x = jax.make_array_from_callback(
        (fine.size,),
        jax.sharding.NamedSharding(fine, spec),
        lambda index: np.ones(fine.size, np.float32)[index],
    )
    compiled = fn.lower(x).compile()
    barrier(f"c2 collectives on {dict(mesh.shape)}")
    jax.block_until_ready(compiled(x))

"""The graph runner: padding to captured sizes, static buffers sized from examples, and loud
capture failures (strict by default, opt-in eager fallback that is reported and counted)."""

from __future__ import annotations

from dataclasses import make_dataclass
from typing import Any

import pytest
import torch

from hotspec.runtime.graph_runner import GraphCaptureError, GraphRunner, default_batch_sizes
from hotspec.runtime.phase_io import PhaseIO


def _io(name: str, *tensors: str) -> Any:
    """A phase input or output type: the named tensors."""
    return make_dataclass(name, [(t, torch.Tensor) for t in tensors], bases=(PhaseIO,), kw_only=True)


AB, A, Y, YZ = _io("AB", "a", "b"), _io("A", "a"), _io("Y", "y"), _io("YZ", "y", "z")
Mixed, YN = _io("Mixed", "a", "i", "t", "d"), _io("YN", "y", "n")


def _phase(x: Any) -> Any:
    return Y(y=x.a * 2 + x.b.sum(-1))


def _example(bs: int) -> Any:
    return AB(a=torch.zeros(bs), b=torch.ones(bs, 5))


def test_typed_phase_graph_takes_and_returns_its_types():
    r = GraphRunner(torch.device("cpu"), "static", [1, 2, 4])
    g = r.register("p", _phase, _example, Y)
    r.capture_all()
    out = g.run(AB(a=torch.tensor([1.0, 2.0]), b=torch.ones(2, 5)))
    assert isinstance(out, Y) and out.y.tolist() == [7.0, 9.0]
    with pytest.raises(ValueError, match="registered already"):
        r.register("p", _phase, _example, Y)
    with pytest.raises(TypeError):
        AB.of({"a": torch.ones(1), "c": torch.ones(1)})  # a mistyped name fails at once


def test_default_batch_sizes():
    assert default_batch_sizes(8) == [1, 2, 4, 8]
    assert default_batch_sizes(40) == [1, 2, 4, 8, 16, 24, 32, 40]
    assert default_batch_sizes(100)[-1] == 100 and 96 in default_batch_sizes(100)


def test_static_mode_pads_and_matches_eager():
    r = GraphRunner(torch.device("cpu"), "static", [1, 2, 4])
    r.register("p", _phase, _example, Y)
    r.capture_all()
    assert r.phases["p"].static["b"].shape == (4, 5)  # allocated once, at the largest size
    x = {"a": torch.tensor([1.0, 2.0, 3.0]), "b": torch.arange(9.0).view(3, 3)}  # narrower b
    out = r.run("p", x)
    assert out["y"].shape == (3,)
    torch.testing.assert_close(out["y"], x["a"] * 2 + x["b"].sum(-1) + 2.0)  # b's 2 stale-free cols are 1
    assert "S" in r.report()
    assert r.captured("p", 3) is None  # static buffers, no CUDA graph


def test_capture_failure_is_an_error_by_default():
    r = GraphRunner(torch.device("cpu"), "cuda", [1, 2])  # no CUDA here: capture must fail
    r.register("draft_extend", _phase, _example, Y)
    with pytest.raises(GraphCaptureError, match="draft_extend.*batch size 1.*--allow-eager-fallback"):
        r.capture_all()


def test_eager_fallback_is_opt_in_reported_and_counted(caplog):
    r = GraphRunner(torch.device("cpu"), "cuda", [1, 2], allow_eager_fallback=True)
    r.register("verify", _phase, _example, Y)
    with caplog.at_level("WARNING"):
        r.capture_all()
    assert r.fallbacks == 2
    assert "EAGER FALLBACK" in r.report() and "verify@1" in r.report()
    assert any("runs EAGER" in m for m in caplog.messages)
    out = r.run("verify", {"a": torch.ones(1), "b": torch.ones(1, 5)})
    torch.testing.assert_close(out["y"], torch.tensor([7.0]))


@pytest.mark.gpu
def test_borrowed_outputs_are_views_of_the_graph_and_the_rest_copies():
    """run(..., borrow=(k,)) hands out k as a view of the captured graph's output (valid until the
    phase replays again: for outputs read at once); every other output is the caller's own copy."""
    dev = torch.device("cuda")
    r = GraphRunner(dev, "cuda", [1, 2])
    r.register("p", lambda x: YZ(y=x.a * 2, z=x.a + 1), lambda bs: A(a=torch.zeros(bs, device=dev)),
               YZ, device_inputs=("a",))
    r.capture_all()
    out = r.run("p", {"a": torch.tensor([3.0, 4.0], device=dev)}, borrow=("y",))
    graph_out = r.graphs[("p", 2)][1]
    assert r.captured("p", 2) is not None and r.captured("p", 3) is None
    assert r.read_back("y") is None  # not published
    assert out["y"].data_ptr() == graph_out["y"].data_ptr()
    assert out["z"].data_ptr() != graph_out["z"].data_ptr()
    assert out["y"].tolist() == [6.0, 8.0] and out["z"].tolist() == [4.0, 5.0]
    r.close()


@pytest.mark.gpu
@pytest.mark.parametrize("published", [False, True], ids=["host_copy", "published"])
def test_launch_and_read_back_do_not_wait_for_later_device_work(published):
    """What the overlap schedule relies on: with the device busy, replaying a phase from host
    inputs returns at once (the inputs written into a pinned slot), and its output, read back
    through the slot the graph published it to (or a HostCopy made before more work is queued),
    is read without waiting for that work."""
    import time

    from hotspec.core.launches import HostCopy

    dev = torch.device("cuda")
    r = GraphRunner(dev, "cuda", [1, 2])
    r.register("p", lambda x: Y(y=x.a * 2), lambda bs: A(a=torch.zeros(bs, device=dev)), Y,
               publish=("y",) if published else ())
    r.capture_all()
    torch.cuda.synchronize()
    torch.cuda._sleep(400_000_000)  # ~0.2 s of device time queued first
    t0 = time.perf_counter()
    out = r.run("p", {"a": torch.tensor([3.0, 4.0])}, borrow=("y",))  # host input
    copy = r.read_back("y") if published else HostCopy(out["y"])
    assert copy is not None
    launched = time.perf_counter() - t0
    torch.cuda._sleep(2_000_000_000)  # ~1 s of later work the read-back must not wait for
    r.run("p", {"a": torch.tensor([5.0, 6.0])})  # overwrites the borrowed view on the device
    t1 = time.perf_counter()
    assert copy.tolist() == [6.0, 8.0]
    read = time.perf_counter() - t1
    t2 = time.perf_counter()
    torch.cuda.synchronize()
    rest = time.perf_counter() - t2
    assert launched < 0.1, f"the launch waited for the device ({launched:.3f} s)"
    assert rest > 0.5, f"the later work had run already ({rest:.3f} s left): the read-back waited"
    assert read < 0.6, read
    r.close()


def test_host_input_layout_is_aligned_views_of_one_buffer():
    """On CUDA a phase's host inputs are views of one byte buffer (which the graph fetches from a
    pinned mirror): each typed and shaped as the example, 16-byte aligned, in order and not
    overlapping."""
    from hotspec.runtime.host_io import layout_of, views_of

    ex = {"ids": torch.arange(3, dtype=torch.long), "flag": torch.tensor([True, False, True]),
          "t": torch.full((3, 5), 7, dtype=torch.int32), "p": torch.ones(3, dtype=torch.float16)}
    layout, size = layout_of(ex)
    blob = torch.zeros(size, dtype=torch.uint8)
    views = views_of(blob, ex, layout)
    ends = 0
    for k, v in ex.items():
        off, row = layout[k]
        assert off % 16 == 0 and off >= ends and row == v[0].numel() * v.element_size()
        ends = off + row * v.shape[0]
        w = views[k]
        assert w.dtype == v.dtype and w.shape == v.shape
        assert w.data_ptr() == blob.data_ptr() + off
        w.copy_(v)
    assert ends <= size
    views["t"][1, 2] = -1  # a view writes the blob
    off, row = layout["t"]
    assert blob[off + row + 8 : off + row + 12].view(torch.int32).item() == -1
    assert torch.equal(views["ids"], ex["ids"]) and torch.equal(views["flag"], ex["flag"])


Bucket = _io("Bucket", "ids", "table", "h")


def _bucket_runner(dev: torch.device, mode: str) -> GraphRunner:
    r = GraphRunner(dev, mode, [1])

    def phase(x: Any) -> Any:
        return Y(y=x.ids.float() + x.table.sum(-1).float() + x.h)

    def example(n: int) -> Any:
        return Bucket(ids=torch.zeros(n, dtype=torch.long, device=dev),
                      table=torch.zeros(n, 3, dtype=torch.int32, device=dev),
                      h=torch.zeros(n, device=dev))

    r.register_buckets("b", phase, example, Y, [4, 8], device_inputs=("h",))
    r.capture_all()
    return r


def _bucket_steps(r: GraphRunner, dev: torch.device) -> None:
    """Step after step through both pinned slots, each size's outputs its own inputs'; a host
    input passed on the device instead overrides the staged copy."""
    for step in range(5):
        n = 4 if step % 2 else 8
        ids = torch.arange(n) * (step + 1)
        table = torch.full((n, 3), step, dtype=torch.int32)
        h = torch.full((n,), 0.5, device=dev)
        out = r.run_bucket("b", {"ids": ids, "table": table, "h": h})
        assert out["y"].tolist() == (ids.float() + 3 * step + 0.5).tolist()
    ids = torch.ones(4, dtype=torch.long, device=dev)  # (as a catch-up's warm-up passes them)
    out = r.run_bucket("b", {"ids": ids, "table": torch.zeros(4, 3, dtype=torch.int32), "h": h[:4]})
    assert out["y"].tolist() == [1.5] * 4


def test_bucket_host_inputs_are_views_of_one_staged_buffer():
    """A bucket graph's host inputs (prefill's ids, positions, slots, lengths, tables) are views
    of one buffer, filled from the host in one copy out of alternating slots; a device input
    (a draft head's hidden_in) is copied on its own."""
    r = _bucket_runner(torch.device("cpu"), "static")
    st = r.bucketed["b"].staged[8]
    assert set(st.static) == {"ids", "table"}
    static = r.bucketed["b"].static[8]
    assert static["ids"].data_ptr() == st.blob.data_ptr() + st.layout["ids"][0]
    assert static["h"].data_ptr() != st.blob.data_ptr()
    _bucket_steps(r, torch.device("cpu"))
    assert st.slot in (0, 1)


@pytest.mark.gpu
def test_gpu_bucket_host_inputs_arrive_in_one_copy():
    """On CUDA the bucket graph's host inputs reach the device in one host-to-device copy from
    pinned memory, and the replayed outputs are each step's own."""
    from torch.profiler import ProfilerActivity, profile

    dev = torch.device("cuda")
    r = _bucket_runner(dev, "cuda")
    assert r.bucketed["b"].staged[4].pinned.is_pinned()
    x = {"ids": torch.arange(4), "table": torch.ones(4, 3, dtype=torch.int32),
         "h": torch.zeros(4, device=dev)}
    r.run_bucket("b", x)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        out = r.run_bucket("b", x)
        torch.cuda.synchronize()
    htod = [e.name for e in prof.events() if e.device_type.name == "CUDA" and "HtoD" in e.name]
    assert len(htod) == 1, htod
    assert out["y"].tolist() == [3.0, 4.0, 5.0, 6.0]
    _bucket_steps(r, dev)
    r.close()


def test_run_needs_every_static_input():
    r = GraphRunner(torch.device("cpu"), "static", [1, 2])
    r.register("p", _phase, _example, Y)
    with pytest.raises(ValueError, match="phase 'p' takes inputs \\['a', 'b'\\], got \\['a'\\]"):
        r.run("p", {"a": torch.ones(1)})


def _mixed_runner(dev):
    r = GraphRunner(dev, "cuda", [1, 4])

    def phase(x: Any) -> Any:
        return YN(y=x.a * 2 + x.t.sum(-1) + x.d, n=x.i + 1)

    def example(bs: int) -> Any:
        return Mixed(a=torch.zeros(bs, device=dev), i=torch.full((bs,), -1, dtype=torch.long, device=dev),
                     t=torch.ones(bs, 6, dtype=torch.int32, device=dev), d=torch.zeros(bs, device=dev))

    r.register("p", phase, example, YN, device_inputs=("d",), publish=("n",))
    r.capture_all()
    return r


@pytest.mark.gpu
def test_host_inputs_reach_the_graph_without_a_copy_and_outputs_come_back_published():
    """A step's host inputs (a narrower table among them) and the padding rows up to the captured
    size reach the graph with no copy on the stream (its first kernel reads them from pinned
    memory), a device input is copied as before, and the published output is read from pinned
    memory: the results equal the phase's own, step after step through both slots."""
    from torch.profiler import ProfilerActivity, profile

    dev = torch.device("cuda")
    r = _mixed_runner(dev)
    x = {"a": torch.tensor([1.0, 2.0, 3.0]), "i": torch.tensor([5, 6, 7]),
         "t": torch.arange(12, dtype=torch.int32).view(3, 4), "d": torch.tensor([0.5, 0.25, 0.0], device=dev)}
    r.run("p", x)  # warm
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        out = r.run("p", x)
        n = r.read_back("n")
        torch.cuda.synchronize()
    memcpy = [e.name for e in prof.events() if e.device_type.name == "CUDA" and "Memcpy" in e.name
              and ("HtoD" in e.name or "DtoH" in e.name)]
    assert memcpy == [], memcpy
    want = x["a"] * 2 + x["t"].sum(-1) + 2 + x["d"].cpu()  # t's two columns past 4 keep the example's 1
    assert out["y"].tolist() == want.tolist() and out["n"].tolist() == [6, 7, 8]
    assert n is not None and n.tolist() == [6, 7, 8]
    static = r.phases["p"].static
    assert static["i"][3].item() == -1 and static["t"][3].tolist() == [1] * 6  # the padding row
    reads = []
    for step in range(5):  # both slots in turn, new values each time, read one step late
        r.run("p", {"a": torch.tensor([float(step)]), "i": torch.tensor([step]),
                    "t": torch.zeros(1, 6, dtype=torch.int32), "d": torch.full((1,), 0.5, device=dev)})
        reads.append(r.read_back("n"))
        if step:
            assert reads[-2].tolist() == [step]
    assert reads[-1].tolist() == [5]
    r.close()


@pytest.mark.gpu
def test_a_published_slot_read_after_its_reuse_is_an_error():
    dev = torch.device("cuda")
    r = _mixed_runner(dev)
    x = {"a": torch.ones(1), "i": torch.tensor([1]), "t": torch.zeros(1, 6, dtype=torch.int32),
         "d": torch.zeros(1, device=dev)}
    r.run("p", x)
    first = r.read_back("n")
    r.run("p", x)
    r.run("p", x)  # the third replay writes the first one's slot
    with pytest.raises(RuntimeError, match="slot was reused"):
        first.tolist()
    with pytest.raises(ValueError, match=r"takes \['a', 'i', 't'\] from the host and \['d'\] on the device"):
        r.run("p", dict(x, d=torch.zeros(1)))
    r.close()


@pytest.mark.gpu
def test_benchmark_replays_keep_the_runner_and_device_counts_together():
    """Replays outside run (a benchmark timing the graph alone) are counted, so the next run
    still reads the slot the host wrote."""
    dev = torch.device("cuda")
    r = _mixed_runner(dev)
    g = r.captured("p", 1)
    assert g is not None
    for _ in range(3):
        g.replay()
    out = r.run("p", {"a": torch.tensor([4.0]), "i": torch.tensor([9]),
                      "t": torch.zeros(1, 6, dtype=torch.int32), "d": torch.zeros(1, device=dev)})
    assert out["n"].tolist() == [10] and r.read_back("n").tolist() == [10]
    torch.cuda.synchronize()
    assert r.counter.item() == r.count
    r.close()


def test_host_copy_on_the_cpu_is_a_snapshot():
    from hotspec.core.launches import HostCopy

    t = torch.tensor([1, 2, 3])
    c = HostCopy(t)
    t.fill_(0)  # the next step overwriting a static buffer
    assert c.tolist() == [1, 2, 3]


@pytest.mark.gpu
@pytest.mark.parametrize("algo", [None, "EAGLE3"], ids=["vanilla", "eagle3"])
def test_gpu_zero_copy_engine_tokens_equal_the_eager_engine(tmp_path, algo):
    """The graphed engine (overlap schedule: its graphs fetch their host inputs from pinned slots
    and publish their tokens there) gives the tokens of the engine without CUDA graphs, float32
    random weights: three requests of different lengths in a batch of four (a padding row),
    greedy and seeded sampling, vanilla and with a random EAGLE-3 head (the fused step)."""
    from engine_utils import greedy_tokens, random_engine

    from hotspec.sampling_params import SamplingParams

    gen = torch.Generator().manual_seed(21)
    prompts = [torch.randint(0, 49152, (n,), generator=gen).tolist() for n in (7, 45, 230)]

    def run(graphed: bool, params: SamplingParams) -> list[list[int]]:
        engine = random_engine(tmp_path, layers=4, dtype=torch.float32, seed=13, algo=algo,
                               graphed=graphed)
        assert engine.worker.overlapping == graphed
        toks = greedy_tokens(engine, prompts, params)
        engine.graphs.close()
        return toks

    for params in (SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True),
                   SamplingParams(temperature=0.8, top_k=50, seed=3, max_tokens=30, ignore_eos=True)):
        want = run(False, params)
        assert all(len(t) == 30 for t in want)
        assert run(True, params) == want, params

"""Stall per save: torch's `dcp.async_save` vs gem_checkpoint's Checkpointer, same 256 MB state.

    python3 -m gem_checkpoint.bench.vs_dcp_async
"""
import time, tempfile, torch, torch.distributed.checkpoint as dcp
from gem_checkpoint import Checkpointer
torch.manual_seed(0)
state = {"w%d" % i: torch.randn(16 << 20) for i in range(4)}  # 4 x 64 MB = 256 MB
d = tempfile.mkdtemp()
# torch's own async_save (its default stager: a host copy, then a thread writes)
st = []
for s in range(3):
    t = time.perf_counter(); fut = dcp.async_save(state, checkpoint_id=f"{d}/dcp{s}"); st.append(time.perf_counter() - t); fut.result()
ck = Checkpointer(f"{d}/gem", keep_last=2)
gs = []
class S:
    def state_dict(self): return state
    def load_state_dict(self, sd): pass
for s in range(3):
    t = time.perf_counter(); ck.save(s + 1, {"m": S()}); gs.append(time.perf_counter() - t); ck.wait()
print("dcp.async_save stall s:", [round(x, 3) for x in st])
print("gem Checkpointer stall s:", [round(x, 3) for x in gs])

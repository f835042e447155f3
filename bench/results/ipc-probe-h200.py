"""Ad-hoc probe: CUDA IPC between pike's parent and a (sandboxed) child."""
import ctypes, json, os, subprocess, sys, time
import torch

cuda = ctypes.CDLL("libcuda.so.1")
class Handle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * 64)]
U64 = ctypes.c_uint64
cuda.cuIpcOpenMemHandle_v2.argtypes = [ctypes.POINTER(U64), Handle, ctypes.c_uint]
cuda.cuIpcGetMemHandle.argtypes = [ctypes.POINTER(Handle), U64]
cuda.cuIpcCloseMemHandle.argtypes = [U64]
cuda.cuMemAlloc_v2.argtypes = [ctypes.POINTER(U64), ctypes.c_size_t]
cuda.cuMemFree_v2.argtypes = [U64]

def ok(rc, what):
    if rc:
        s = ctypes.c_char_p(); cuda.cuGetErrorName(rc, ctypes.byref(s))
        raise RuntimeError(f"{what}: {rc} {s.value}")

class View:
    def __init__(self, ptr, n):
        self.__cuda_array_interface__ = {"shape": (n,), "typestr": "|u1", "data": (ptr, False),
                                         "version": 3, "strides": None, "stream": None}

def as_bytes(ptr, n):
    return torch.as_tensor(View(ptr, n), device="cuda")

N = 1 << 30

def child(mode):
    torch.zeros(1, device="cuda"); torch.cuda.synchronize()
    line = sys.stdin.readline()
    h = Handle(); ctypes.memmove(ctypes.byref(h), bytes.fromhex(line.strip()), 64)
    t0 = time.perf_counter(); p = U64()
    rc = cuda.cuIpcOpenMemHandle_v2(ctypes.byref(p), h, 1)
    if rc:
        s = ctypes.c_char_p(); cuda.cuGetErrorName(rc, ctypes.byref(s)); print("OPENFAIL", rc, s.value, flush=True); return
    t1 = time.perf_counter()
    b = as_bytes(p.value, N)
    src = torch.full((N,), 7, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize(); t2 = time.perf_counter()
    b.copy_(src); torch.cuda.synchronize(); t3 = time.perf_counter()
    print(f"CHILD open {t1-t0:.4f}s copy1GB {t3-t2:.4f}s", flush=True)
    if mode == "linger":  # keep the mapping, wait, then write 9 after the parent freed
        sys.stdin.readline()
        b.fill_(9); torch.cuda.synchronize(); print("CHILD wrote 9 after free", flush=True)
        sys.stdin.readline()
        return
    del b
    ok(cuda.cuIpcCloseMemHandle(p.value), "close")
    print("CHILD closed", flush=True)

def exporter():
    t = torch.full((N,), 5, dtype=torch.uint8, device="cuda"); torch.cuda.synchronize()
    base = U64(); size = ctypes.c_size_t()
    cuda.cuMemGetAddressRange_v2.argtypes = [ctypes.POINTER(U64), ctypes.POINTER(ctypes.c_size_t), U64]
    ok(cuda.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), t.data_ptr()), "range")
    h = Handle(); ok(cuda.cuIpcGetMemHandle(ctypes.byref(h), base.value), "get")
    print(bytes(h.reserved).hex() if len(bytes(h.reserved)) == 64 else ctypes.string_at(ctypes.byref(h), 64).hex(), t.data_ptr() - base.value, flush=True)
    sys.stdin.readline()
    os._exit(0)  # dies while the parent has it open

def run_child(prefix, mode, env=None):
    return subprocess.Popen([*prefix, sys.executable, "/probe/ipc_probe.py" if prefix else os.path.abspath(__file__), mode], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env=env)

def parent():
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
    from pike.evaluate.os_sandbox import SandboxPlan, Mount, sandbox_problem
    print("sandbox problem:", sandbox_problem())
    here = os.path.dirname(os.path.abspath(__file__))
    boxed = SandboxPlan(mounts=[Mount(host=here, inside="/probe")]).prefix()
    torch.zeros(1, device="cuda"); torch.cuda.synchronize()
    for name, prefix in (("plain", []), ("bwrap", boxed)):
        for mode in ("close", "linger"):
            ptr = U64(); ok(cuda.cuMemAlloc_v2(ctypes.byref(ptr), N), "alloc")
            as_bytes(ptr.value, N).zero_(); torch.cuda.synchronize()
            h = Handle(); ok(cuda.cuIpcGetMemHandle(ctypes.byref(h), ptr.value), "get")
            hx = ctypes.string_at(ctypes.byref(h), 64).hex()
            c = run_child(prefix, mode)
            c.stdin.write(hx + "\n"); c.stdin.flush()
            line = c.stdout.readline().strip(); print(name, mode, "->", line, flush=True)
            if "OPENFAIL" in line:
                c.wait(); ok(cuda.cuMemFree_v2(ptr.value), "free"); continue
            v = as_bytes(ptr.value, N)
            print(name, mode, "parent sees", int(v[:1].item()), int(v[-1:].item()), "all 7:", bool((v == 7).all()), flush=True)
            del v
            if mode == "linger":
                ok(cuda.cuMemFree_v2(ptr.value), "free")
                ptr2 = U64(); ok(cuda.cuMemAlloc_v2(ctypes.byref(ptr2), N), "alloc2")
                w = as_bytes(ptr2.value, N); w.fill_(1); torch.cuda.synchronize()
                print("realloc same address:", ptr2.value == ptr.value, flush=True)
                c.stdin.write("go\n"); c.stdin.flush()
                print(name, "linger ->", c.stdout.readline().strip(), flush=True)
                torch.cuda.synchronize()
                print(name, "after child wrote post-free: new alloc all 1:", bool((w == 1).all()), flush=True)
                del w
                c.stdin.write("end\n"); c.stdin.flush(); c.wait()
                ok(cuda.cuMemFree_v2(ptr2.value), "free2")
            else:
                print(name, mode, "<-", c.stdout.readline().strip()); c.wait()
                ok(cuda.cuMemFree_v2(ptr.value), "free")
        # reverse: child exports, dies, parent reads
        c = run_child(prefix, "export")
        hx, off = c.stdout.readline().split()
        h = Handle(); ctypes.memmove(ctypes.byref(h), bytes.fromhex(hx), 64)
        p = U64(); rc = cuda.cuIpcOpenMemHandle_v2(ctypes.byref(p), h, 1)
        print(name, "reverse open rc", rc, flush=True)
        c.stdin.write("die\n"); c.stdin.flush(); c.wait()
        if rc == 0:
            try:
                v = as_bytes(p.value + int(off), N)
                print(name, "reverse after exporter died: all 5:", bool((v == 5).all()), flush=True)
                del v; torch.cuda.synchronize()
                print(name, "parent context fine:", float(torch.ones(3, device="cuda").sum()), flush=True)
                cuda.cuIpcCloseMemHandle(p.value)
            except Exception as e:
                print(name, "reverse read failed:", repr(e)[:200], flush=True)
                return

if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "export":
        exporter()
    elif len(sys.argv) > 1:
        child(sys.argv[1])
    else:
        parent()

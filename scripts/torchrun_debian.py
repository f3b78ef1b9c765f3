# torchrun for Debian's torch 1.13 on Python 3.11: there Std.from_str("0")
# returns None (Python 3.11's IntFlag no longer iterates zero and
# multi-bit members) and torchrun fails before it starts a worker. This
# fixes that one function and calls torch.distributed.run.main unchanged.
# The benchmark scripts copy it next to their other files and run it with
# /usr/bin/python3 in torchrun's place.
import sys
from torch.distributed.elastic.multiprocessing import api
_orig = api.Std.from_str.__func__
api.Std.from_str = classmethod(lambda cls, vm: cls(int(vm)) if vm.isdigit() else _orig(cls, vm))
from torch.distributed.run import main
sys.exit(main())

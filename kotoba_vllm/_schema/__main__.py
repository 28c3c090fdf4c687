import sys

from . import rendered, write

if "--write" in sys.argv:
    write()
else:
    for rel, text in rendered().items():
        print(f";; ---- {rel}\n{text}")

build-asan/obj/core/queue.o: src/core/queue.c src/core/internal.h \
 include/tpurt/runtime.h include/tpurt/base.h src/core/kinds.def \
 src/core/kinds_elementwise.def src/core/kinds_reduce.def \
 src/core/kinds_linalg.def src/core/kinds_nn.def src/core/kinds_index.def \
 src/core/kinds_random.def
src/core/internal.h:
include/tpurt/runtime.h:
include/tpurt/base.h:
src/core/kinds.def:
src/core/kinds_elementwise.def:
src/core/kinds_reduce.def:
src/core/kinds_linalg.def:
src/core/kinds_nn.def:
src/core/kinds_index.def:
src/core/kinds_random.def:

"""XLA's files: dump folders (``dump`` over ``dump_files`` and ``dump_buffers``; ``runtime``: a
module as the runtime hands it to its allocator) and profiler ``.xplane.pb`` files (``xplane``
over ``xplane_proto``, a wire-format reader). Each importer registers itself with
:mod:`allocsim.traces.formats.registry` when imported; :mod:`allocsim.traces.formats` imports
them. This package imports nothing itself."""

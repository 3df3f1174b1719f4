// kvtier.Space and the argument classes of its calls (kvtier.PutItem, kvtier.PagedKvCache), and
// content_key: the bindings of the SDK's Space (kvtier/client.h) over SpaceState
// (handle_states.h). Every argument is checked (arguments.h) before anything is sent; every call
// that waits for the daemon releases the GIL.
#pragma once

#include <pybind11/pybind11.h>

namespace kvtier::python {

namespace py = pybind11;

// Defines kvtier.PutItem, kvtier.PagedKvCache, kvtier.Space and kvtier.content_key in `m` (module
// init, after kvtier.Client and before the handle classes).
void defineSpace(py::module_& m);

}  // namespace kvtier::python

// kvtier.ReadHandle, kvtier.BlobHandle and kvtier.WriteHandle: the bindings of the SDK's handles
// (kvtier/client.h) over their HandleStates (handle_states.h), whose rules for lifetimes and views
// they follow.
#pragma once

#include <pybind11/pybind11.h>

namespace kvtier::python {

namespace py = pybind11;

// Defines kvtier.ReadHandle, kvtier.BlobHandle and kvtier.WriteHandle in `m` (module init, after
// kvtier.Space).
void defineHandles(py::module_& m);

}  // namespace kvtier::python

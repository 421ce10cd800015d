/* An empty Python module around the kernels, so that setuptools builds and installs them as an
 * extension (``specdec_core.execution._gguf_kernels``); Python calls the kernels through ctypes. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_gguf_kernels",
                                    "GGUF block kernels (called through ctypes, see gguf_kernels.py)", -1, NULL};

PyMODINIT_FUNC PyInit__gguf_kernels(void) { return PyModule_Create(&module); }

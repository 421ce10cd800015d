/* An empty Python module around the C library, so that setuptools builds and installs it as an
 * extension (``specdec_core.kernels._c_library``); Python calls the library through ctypes. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_c_library",
                                    "specdec's C library (called through ctypes, see c_library.py)", -1, NULL};

PyMODINIT_FUNC PyInit__c_library(void) { return PyModule_Create(&module); }

/* service._regonative: push a Python value onto a regopy input handle in one call.
 *
 * regopy's input API is a stack machine with one native call per JSON node. Made from Python,
 * each call goes through ctypes (~0.5 us of overhead), which made input conversion the largest
 * Python-side cost of a policy decision. This module makes the same calls, in the same order,
 * from C (service/rego.py keeps the pure-Python converter as the reference and the fallback).
 * It does not link against the rego library: bind() receives the addresses of the library's
 * functions from the ctypes handle regopy itself loaded, so both use the same library instance.
 *
 * Accepted: exact str, int (64-bit), float, bool, None, dict with str keys, list, tuple. Anything
 * else raises TypeError, so the caller can fall back to the Python converter (which also accepts
 * other Mapping types). Strings containing NUL raise ValueError (a C string would truncate them).
 *
 * regopy takes a string that starts and ends with a double quote for a JSON string literal and
 * strips that pair of quotes; such strings are passed with one more pair, so that the policy
 * sees exactly the service's value (service/rego.py's _push does the same).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

typedef unsigned int (*str_fn)(void *, const char *);
typedef unsigned int (*int_fn)(void *, long long);
typedef unsigned int (*float_fn)(void *, double);
typedef unsigned int (*bool_fn)(void *, _Bool);
typedef unsigned int (*void_fn)(void *);
typedef unsigned int (*count_fn)(void *, unsigned int);

static str_fn in_string;
static int_fn in_int;
static float_fn in_float;
static bool_fn in_bool;
static void_fn in_null, in_item;
static count_fn in_object, in_array;

#define MAX_DEPTH 64

static int add_string(void *h, PyObject *s) {
    Py_ssize_t size;
    const char *raw = PyUnicode_AsUTF8AndSize(s, &size);
    if (raw == NULL) {
        return -1;
    }
    if (memchr(raw, '\0', (size_t)size) != NULL) {
        PyErr_SetString(PyExc_ValueError, "NUL character in input string");
        return -1;
    }
    if (size >= 2 && raw[0] == '"' && raw[size - 1] == '"') {
        /* regopy would strip one pair of enclosing quotes: add one so the policy sees raw. */
        char *quoted = PyMem_Malloc((size_t)size + 3);
        if (quoted == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        quoted[0] = '"';
        memcpy(quoted + 1, raw, (size_t)size);
        quoted[size + 1] = '"';
        quoted[size + 2] = '\0';
        unsigned int rc = in_string(h, quoted);
        PyMem_Free(quoted);
        return rc ? -2 : 0;
    }
    return in_string(h, raw) ? -2 : 0;
}

static int add(void *h, PyObject *v, int depth) {
    if (depth > MAX_DEPTH) {
        PyErr_SetString(PyExc_ValueError, "input nests too deeply");
        return -1;
    }
    if (PyUnicode_CheckExact(v)) {
        return add_string(h, v);
    }
    if (v == Py_None) {
        return in_null(h) ? -2 : 0;
    }
    if (PyBool_Check(v)) {
        return in_bool(h, v == Py_True) ? -2 : 0;
    }
    if (PyLong_CheckExact(v)) {
        long long x = PyLong_AsLongLong(v);
        if (x == -1 && PyErr_Occurred()) {
            return -1;
        }
        return in_int(h, x) ? -2 : 0;
    }
    if (PyFloat_CheckExact(v)) {
        return in_float(h, PyFloat_AS_DOUBLE(v)) ? -2 : 0;
    }
    if (PyDict_CheckExact(v)) {
        /* No Python code runs below (keys are exact str), so the dict cannot change under us. */
        Py_ssize_t pos = 0;
        PyObject *key, *item;
        Py_ssize_t n = PyDict_GET_SIZE(v);
        while (PyDict_Next(v, &pos, &key, &item)) {
            if (!PyUnicode_CheckExact(key)) {
                PyErr_SetString(PyExc_ValueError, "input object keys must be strings");
                return -1;
            }
            int rc = add_string(h, key);
            if (rc) return rc;
            rc = add(h, item, depth + 1);
            if (rc) return rc;
            if (in_item(h)) return -2;
        }
        return in_object(h, (unsigned int)n) ? -2 : 0;
    }
    if (PyList_CheckExact(v) || PyTuple_CheckExact(v)) {
        Py_ssize_t n = PySequence_Fast_GET_SIZE(v);
        PyObject **items = PySequence_Fast_ITEMS(v);
        for (Py_ssize_t i = 0; i < n; i++) {
            int rc = add(h, items[i], depth + 1);
            if (rc) return rc;
        }
        return in_array(h, (unsigned int)n) ? -2 : 0;
    }
    PyErr_Format(PyExc_TypeError, "cannot convert %s to rego input", Py_TYPE(v)->tp_name);
    return -1;
}

static PyObject *bind(PyObject *Py_UNUSED(self), PyObject *args) {
    unsigned long long a[8];
    if (!PyArg_ParseTuple(args, "KKKKKKKK", &a[0], &a[1], &a[2], &a[3], &a[4], &a[5], &a[6],
                          &a[7])) {
        return NULL;
    }
    for (int i = 0; i < 8; i++) {
        if (a[i] == 0) {
            PyErr_SetString(PyExc_ValueError, "bind() needs eight function addresses");
            return NULL;
        }
    }
    in_string = (str_fn)(uintptr_t)a[0];
    in_int = (int_fn)(uintptr_t)a[1];
    in_float = (float_fn)(uintptr_t)a[2];
    in_bool = (bool_fn)(uintptr_t)a[3];
    in_null = (void_fn)(uintptr_t)a[4];
    in_item = (void_fn)(uintptr_t)a[5];
    in_object = (count_fn)(uintptr_t)a[6];
    in_array = (count_fn)(uintptr_t)a[7];
    Py_RETURN_NONE;
}

static PyObject *build(PyObject *Py_UNUSED(self), PyObject *args) {
    unsigned long long handle;
    PyObject *value;
    if (!PyArg_ParseTuple(args, "KO", &handle, &value)) {
        return NULL;
    }
    if (in_string == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "bind() was not called");
        return NULL;
    }
    int rc = add((void *)(uintptr_t)handle, value, 0);
    if (rc == -1) {
        return NULL;
    }
    if (rc == -2) {
        PyErr_SetString(PyExc_ValueError, "the native library refused the input");
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"bind", bind, METH_VARARGS,
     "bind(string, int, float, boolean, null, object_item, object, array): the addresses of "
     "regoInputString, regoInputInt, regoInputFloat, regoInputBoolean, regoInputNull, "
     "regoInputObjectItem, regoInputObject and regoInputArray."},
    {"build", build, METH_VARARGS, "build(handle, value): push value onto the input handle."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    .m_base = PyModuleDef_HEAD_INIT,
    .m_name = "_regonative",
    .m_doc = "Builds regopy input documents from C (see service/rego.py).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__regonative(void) { return PyModule_Create(&module); }

/* The compiled form of tcl.records.metaschedule's trace walker: `trace_to_steps_py` in C.
 *
 * Same steps, same objects, for every trace it accepts; it accepts only traces shaped as
 * orjson parses TVM's (lists, exact str/int, ASCII variable names) and returns None for
 * anything else -- an unknown kind, a malformed instruction, a value the Python walker would
 * trip on -- so that the Python walker decides those (its result, its reject reason). It never
 * raises except on memory exhaustion. Built by setup.py as tcl/records/_trace_steps*.so;
 * optional: without it the Python walker runs alone (tests/test_trace_steps.py compares the two).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#define MAX_DEPTH 64   /* nesting a flattened value may have; deeper -> the Python walker */
#define MAX_OUTPUTS (1 << 16)  /* the Python walker numbers at most this many loop outputs */

static PyObject *DROP;  /* the value of a block variable: it adds nothing to a step */
static PyObject *POSITIONS;  /* tuple of ints 0..MAX_OUTPUTS-1: a loop's position among its outputs */

/* Result of a helper: OK, BAIL (the Python walker decides this trace) or ERR (exception set). */
enum { OK = 0, BAIL = 1, ERR = -1 };

/* a string literal is stored quoted: "\"abc\"" -> "abc"; new reference */
static PyObject *unquoted(PyObject *s) {
    Py_ssize_t n = PyUnicode_GET_LENGTH(s);
    if (n >= 2 && PyUnicode_READ_CHAR(s, 0) == '"' && PyUnicode_READ_CHAR(s, n - 1) == '"')
        return PyUnicode_Substring(s, 1, n - 1);
    Py_INCREF(s);
    return s;
}

static int append_new(PyObject *list, PyObject *item) {
    if (item == NULL)
        return ERR;
    int rc = PyList_Append(list, item);
    Py_DECREF(item);
    return rc < 0 ? ERR : OK;
}

/* `_flatten`: the scalars of a nested list, quoted strings unquoted */
static int flatten(PyObject *value, PyObject *out, int depth) {
    if (depth > MAX_DEPTH)
        return BAIL;
    Py_ssize_t n = PyList_GET_SIZE(value);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PyList_GET_ITEM(value, i);
        int rc;
        if (PyList_CheckExact(v))
            rc = flatten(v, out, depth + 1);
        else if (PyUnicode_CheckExact(v))
            rc = append_new(out, unquoted(v));
        else
            rc = PyList_Append(out, v) < 0 ? ERR : OK;
        if (rc != OK)
            return rc;
    }
    return OK;
}

/* `^[a-z]\d+$` (re.match): 1 or 0; -1 where only `re` can tell (its \d takes any Unicode digit,
 * its $ a final newline) */
static int is_variable_name(PyObject *s) {
    Py_ssize_t n = PyUnicode_GET_LENGTH(s);
    if (n < 2)
        return 0;
    Py_UCS4 first = PyUnicode_READ_CHAR(s, 0);
    if (first < 'a' || first > 'z')
        return 0;
    if (!PyUnicode_IS_ASCII(s))
        return -1;
    const char *c = (const char *)PyUnicode_DATA(s);
    if (c[n - 1] == '\n')
        return -1;
    for (Py_ssize_t i = 1; i < n; i++)
        if (c[i] < '0' || c[i] > '9')
            return 0;
    return 1;
}

static int set_value(PyObject *values, PyObject *name, PyObject *value) {
    if (PyDict_SetItem(values, name, value) == 0)
        return OK;
    if (PyErr_ExceptionMatches(PyExc_TypeError)) {  /* an unhashable name */
        PyErr_Clear();
        return BAIL;
    }
    return ERR;
}

static int add_inputs(PyObject *inputs, PyObject *values, PyObject *step) {
    Py_ssize_t n = PyList_GET_SIZE(inputs);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *x = PyList_GET_ITEM(inputs, i);
        int rc = OK;
        if (PyUnicode_CheckExact(x)) {
            PyObject *v = PyDict_GetItemWithError(values, x);  /* borrowed */
            if (v == NULL && PyErr_Occurred())
                return ERR;
            if (v == DROP)
                continue;
            if (v != NULL && v != Py_None) {
                rc = PyList_Append(step, v) < 0 ? ERR : OK;
            } else {  /* a variable never defined here carries nothing; a literal is kept */
                int name = is_variable_name(x);
                if (name < 0)
                    return BAIL;
                if (!name)
                    rc = append_new(step, unquoted(x));
            }
        } else if (PyList_CheckExact(x)) {
            rc = flatten(x, step, 0);
        } else {
            rc = PyList_Append(step, x) < 0 ? ERR : OK;
        }
        if (rc != OK)
            return rc;
    }
    return OK;
}

/* outputs name variables of one sort: loops get their position, anything else DROP */
static int define_outputs(PyObject *outputs, PyObject *values) {
    Py_ssize_t n = PyList_GET_SIZE(outputs);
    if (n == 0)
        return OK;
    PyObject *first = PyList_GET_ITEM(outputs, 0);
    if (!PyUnicode_CheckExact(first) || n > MAX_OUTPUTS)
        return BAIL;
    int loops = PyUnicode_GET_LENGTH(first) >= 1 && PyUnicode_READ_CHAR(first, 0) == 'l';
    for (Py_ssize_t i = 0; i < n; i++) {
        int rc = set_value(values, PyList_GET_ITEM(outputs, i), loops ? PyTuple_GET_ITEM(POSITIONS, i) : DROP);
        if (rc != OK)
            return rc;
    }
    return OK;
}

static int apply_decision(PyObject *kind, PyObject *attrs, PyObject *outputs, PyObject *decision,
                          PyObject *values, PyObject *step, PyObject *tile_kinds, PyObject *categorical) {
    int rc = PyList_CheckExact(decision) ? flatten(decision, step, 0)
                                         : (PyList_Append(step, decision) < 0 ? ERR : OK);
    if (rc != OK)
        return rc;
    int tile = PySet_Contains(tile_kinds, kind);
    if (tile < 0)
        return ERR;
    if (tile) {
        if (!PyList_CheckExact(decision))
            return BAIL;  /* zip() over a scalar: the Python walker raises */
        Py_ssize_t n = PyList_GET_SIZE(outputs);
        for (Py_ssize_t i = 0; i < n && i < PyList_GET_SIZE(decision); i++)
            if ((rc = set_value(values, PyList_GET_ITEM(outputs, i), PyList_GET_ITEM(decision, i))) != OK)
                return rc;
        return OK;
    }
    int eq = PyUnicode_Compare(kind, categorical);
    if (eq == -1 && PyErr_Occurred())
        return ERR;
    if (eq != 0)
        return OK;
    if (PyList_GET_SIZE(attrs) < 1 || !PyList_CheckExact(PyList_GET_ITEM(attrs, 0)))
        return BAIL;
    PyObject *candidates = PyList_GET_ITEM(attrs, 0);
    if (!PyLong_CheckExact(decision))
        return OK;
    int overflow;
    long long pick = PyLong_AsLongLongAndOverflow(decision, &overflow);
    if (overflow || pick < 0 || pick >= PyList_GET_SIZE(candidates))
        return OK;  /* out of range: no value */
    if (PyList_GET_SIZE(outputs) < 1)
        return BAIL;
    return set_value(values, PyList_GET_ITEM(outputs, 0), PyList_GET_ITEM(candidates, pick));
}

/* walk(trace, kinds, tile_kinds, categorical_kind) -> steps, or None: see the file's comment */
static PyObject *walk(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 4 || !PyAnySet_Check(args[1]) || !PyAnySet_Check(args[2]) || !PyUnicode_Check(args[3])) {
        PyErr_SetString(PyExc_TypeError, "walk(trace, kinds: frozenset, tile_kinds: frozenset, categorical: str)");
        return NULL;
    }
    PyObject *trace = args[0], *kinds = args[1], *tile_kinds = args[2], *categorical = args[3];
    if (!PyList_CheckExact(trace) || PyList_GET_SIZE(trace) < 2)
        Py_RETURN_NONE;
    PyObject *insts = PyList_GET_ITEM(trace, 0), *decisions = PyList_GET_ITEM(trace, 1);
    if (!PyList_CheckExact(insts) || !PyList_CheckExact(decisions))
        Py_RETURN_NONE;
    Py_ssize_t n = PyList_GET_SIZE(insts);
    PyObject **decided = NULL, *values = NULL, *steps = NULL, *result = NULL;
    int rc = OK;
    /* instruction index -> its decision (borrowed; the last one of an index wins, as in a dict) */
    decided = PyMem_Calloc(n ? n : 1, sizeof(PyObject *));
    values = PyDict_New();
    steps = PyList_New(0);
    if (decided == NULL || values == NULL || steps == NULL) {
        if (decided == NULL)
            PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(decisions); i++) {
        PyObject *d = PyList_GET_ITEM(decisions, i);
        if (!PyList_CheckExact(d) || PyList_GET_SIZE(d) != 2 || !PyLong_CheckExact(PyList_GET_ITEM(d, 0))) {
            rc = BAIL;
            goto done;
        }
        int overflow;
        long long index = PyLong_AsLongLongAndOverflow(PyList_GET_ITEM(d, 0), &overflow);
        if (!overflow && index >= 0 && index < n)
            decided[index] = PyList_GET_ITEM(d, 1);
    }
    for (Py_ssize_t i = 0; i < n && rc == OK; i++) {
        PyObject *inst = PyList_GET_ITEM(insts, i);
        if (!PyList_CheckExact(inst) || PyList_GET_SIZE(inst) != 4) {
            rc = BAIL;
            break;
        }
        PyObject *kind = PyList_GET_ITEM(inst, 0), *inputs = PyList_GET_ITEM(inst, 1);
        PyObject *attrs = PyList_GET_ITEM(inst, 2), *outputs = PyList_GET_ITEM(inst, 3);
        if (!PyUnicode_CheckExact(kind) || !PyList_CheckExact(inputs) || !PyList_CheckExact(attrs)
            || !PyList_CheckExact(outputs)) {
            rc = BAIL;
            break;
        }
        int known = PySet_Contains(kinds, kind);
        if (known <= 0) {
            rc = known < 0 ? ERR : BAIL;  /* an unknown kind: the Python walker names it */
            break;
        }
        PyObject *step = PyList_New(1);
        if (step == NULL) {
            rc = ERR;
            break;
        }
        Py_INCREF(kind);
        PyList_SET_ITEM(step, 0, kind);
        if ((rc = add_inputs(inputs, values, step)) == OK && (rc = flatten(attrs, step, 0)) == OK  /* attrs: as a list input */
            && (rc = define_outputs(outputs, values)) == OK && decided[i] != NULL && decided[i] != Py_None)
            rc = apply_decision(kind, attrs, outputs, decided[i], values, step, tile_kinds, categorical);
        if (rc == OK && PyList_Append(steps, step) < 0)
            rc = ERR;
        Py_DECREF(step);
    }
done:
    if (rc == OK && steps != NULL && values != NULL && decided != NULL) {
        result = steps;
        steps = NULL;
    } else if (rc == BAIL) {
        result = Py_NewRef(Py_None);
    }
    PyMem_Free(decided);
    Py_XDECREF(values);
    Py_XDECREF(steps);
    return result;
}

static PyMethodDef methods[] = {
    {"walk", (PyCFunction)(void (*)(void))walk, METH_FASTCALL,
     "walk(trace, kinds, tile_kinds, categorical_kind) -> steps of a MetaSchedule trace, or None where "
     "the Python walker must decide"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_trace_steps", NULL, -1, methods};

PyMODINIT_FUNC PyInit__trace_steps(void) {
    PyObject *m = PyModule_Create(&module);
    if (m == NULL)
        return NULL;
    DROP = PyObject_CallNoArgs((PyObject *)&PyBaseObject_Type);
    POSITIONS = PyTuple_New(MAX_OUTPUTS);
    if (DROP == NULL || POSITIONS == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < MAX_OUTPUTS; i++) {
        PyObject *v = PyLong_FromSsize_t(i);
        if (v == NULL)
            goto fail;
        PyTuple_SET_ITEM(POSITIONS, i, v);
    }
    return m;
fail:
    Py_XDECREF(DROP);
    Py_XDECREF(POSITIONS);
    Py_DECREF(m);
    return NULL;
}

/* The step recorder's hot path in C: what `with agent.step():` runs on a steady step (the
 * recorder's `__enter__` and `__exit__`, StepCore, and the agent's `step()`, AgentCore).
 *
 * The Python recorder (agent/_step_recorder.py) says what the hot path may do; this file does
 * exactly that and nothing more, with the same fields and the same decisions as the pure-Python
 * `PyStepCore` there (which runs where this module was not built). Why C: after a DDP step the
 * training thread finds its caches cold, and each Python frame, each attribute and each code
 * object touched costs a handful of memory lines; a method of this type touches its own struct
 * and the ring (benchmarks/agent_overhead.py, docs/agent.md "Overhead").
 *
 * Everything that is not a steady step goes back to Python through the subclass's methods
 * (`_begin_slow`, `_exit_slow`, `_device_mark`). Every field is also a plain attribute, so the
 * report thread, the forward hook and the tests read and write them as before. All of it runs
 * holding the GIL, which orders the ring's stores for the report thread (see the Python module).
 *
 * The clock is CLOCK_MONOTONIC, what `time.perf_counter_ns()` reads on Linux (CPython's
 * Python/pytime.c); setup.py builds this module on Linux only, and the recorder module checks at
 * import that both clocks agree before it uses it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <time.h>

/* Ring slots: agent/_step_recorder.py CAPACITY (checked there at import through RING_SLOTS). */
#define RING_SLOTS 4096
#define RING_MASK (RING_SLOTS - 1)
/* ForwardMatch.forwards_matched outside a step: agent/step_flops.py OUTSIDE (checked likewise). */
#define OUTSIDE (-2)

typedef struct {
    PyObject_HEAD
    long long begun;            /* steps begun; step first_step + n has ring slot n % RING_SLOTS */
    long long depth;            /* nesting of `with agent.step()` */
    long long slow_from;        /* the first step (count of steps begun) that takes the slow path */
    long long last_end_ns;      /* the clock at the latest step's end */
    long long first_step;
    long long forwards_matched; /* written by the model's forward pre-hook */
    long long steady_forwards;
    PyObject *starts;           /* list of RING_SLOTS ints: the clock at each step's start */
    PyObject *timer;            /* the device step timer (GPU), None on CPU */
} StepCore;

/* A clock the tests set (`set_clock`) in place of the real one; NULL in production. */
static PyObject *test_clock = NULL;

/* The clock in ns; -1 with the exception set when a test clock failed. */
static long long
clock_ns(void)
{
    if (test_clock != NULL) {
        PyObject *reading = PyObject_CallNoArgs(test_clock);
        if (reading == NULL) {
            return -1;
        }
        long long value = PyLong_AsLongLong(reading);
        Py_DECREF(reading);
        return value == -1 && PyErr_Occurred() ? -1 : value;
    }
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static PyObject *
set_clock(PyObject *Py_UNUSED(module), PyObject *clock)
{
    if (clock != Py_None && !PyCallable_Check(clock)) {
        PyErr_SetString(PyExc_TypeError, "set_clock takes a callable or None");
        return NULL;
    }
    Py_XSETREF(test_clock, clock == Py_None ? NULL : Py_NewRef(clock));
    Py_RETURN_NONE;
}

static int
has_timer(StepCore *self)
{
    return self->timer != NULL && self->timer != Py_None;
}

/* The names of the subclass's methods the hot path calls back (interned at module init, so a
 * call looks a method up without making a string). */
static PyObject *name_begin_slow;
static PyObject *name_exit_slow;
static PyObject *name_device_mark;

/* self.<name>(number, flag) for the slow path and the device timer (`_exit_slow`,
 * `_device_mark`); returns 0, or -1 with the exception set. */
static int
call_method(StepCore *self, PyObject *name, long long number, PyObject *flag)
{
    PyObject *value = PyLong_FromLongLong(number);
    if (value == NULL) {
        return -1;
    }
    PyObject *args[] = {(PyObject *)self, value, flag};
    PyObject *result = PyObject_VectorcallMethod(name, args, 3, NULL);
    Py_DECREF(value);
    if (result == NULL) {
        return -1;
    }
    Py_DECREF(result);
    return 0;
}

static PyObject *
StepCore_enter(StepCore *self, PyObject *Py_UNUSED(ignored))
{
    long long n = self->begun;
    if (self->depth || n >= self->slow_from) {
        PyObject *args[] = {(PyObject *)self, Py_None};
        PyObject *result = PyObject_VectorcallMethod(name_begin_slow, args, 2, NULL);
        if (result == NULL) {
            return NULL;
        }
        Py_DECREF(result);
        return Py_NewRef(self);
    }
    if (self->starts == NULL || !PyList_CheckExact(self->starts) ||
        PyList_GET_SIZE(self->starts) != RING_SLOTS) {
        PyErr_SetString(PyExc_RuntimeError, "step recorder: starts is not its ring");
        return NULL;
    }
    long long now = clock_ns();
    if (now == -1 && PyErr_Occurred()) {
        return NULL;
    }
    PyObject *start = PyLong_FromLongLong(now);
    if (start == NULL) {
        return NULL;
    }
    self->depth = 1;
    self->forwards_matched = 0;
    PyObject *old = PyList_GET_ITEM(self->starts, n & RING_MASK);
    PyList_SET_ITEM(self->starts, n & RING_MASK, start);
    Py_XDECREF(old);
    if (has_timer(self) &&
        call_method(self, name_device_mark, self->first_step + n, Py_True) < 0) {
        return NULL;
    }
    self->begun = n + 1; /* publishes the slot to the report thread */
    return Py_NewRef(self);
}

static PyObject *
StepCore_exit(StepCore *self, PyObject *const *args, Py_ssize_t nargs)
{
    long long now = clock_ns();
    if (now == -1 && PyErr_Occurred()) {
        return NULL;
    }
    PyObject *exc_type = nargs > 0 ? args[0] : Py_None;
    if (exc_type != Py_None || self->depth != 1 ||
        self->forwards_matched != self->steady_forwards) {
        PyObject *failed = exc_type != Py_None ? Py_True : Py_False;
        if (call_method(self, name_exit_slow, now, failed) < 0) {
            return NULL;
        }
        Py_RETURN_NONE; /* never swallows the training loop's own exception */
    }
    if (has_timer(self) &&
        call_method(self, name_device_mark, self->first_step + self->begun - 1, Py_False) < 0) {
        return NULL;
    }
    self->last_end_ns = now;
    self->forwards_matched = OUTSIDE;
    self->depth = 0;
    Py_RETURN_NONE;
}

static PyObject *
StepCore_clock_ns(PyObject *Py_UNUSED(cls), PyObject *Py_UNUSED(ignored))
{
    long long now = clock_ns();
    return now == -1 && PyErr_Occurred() ? NULL : PyLong_FromLongLong(now);
}

static int
StepCore_traverse(StepCore *self, visitproc visit, void *arg)
{
    Py_VISIT(self->starts);
    Py_VISIT(self->timer);
    return 0; /* a heap subclass's own slots and type: CPython's subtype_traverse */
}

static int
StepCore_clear(StepCore *self)
{
    Py_CLEAR(self->starts);
    Py_CLEAR(self->timer);
    return 0;
}

static void
StepCore_dealloc(StepCore *self)
{
    /* Reached through CPython's subtype_dealloc for the Python subclass, which also releases
     * the subclass's type: a static base must not. */
    PyObject_GC_UnTrack(self);
    StepCore_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMethodDef StepCore_methods[] = {
    {"__enter__", (PyCFunction)StepCore_enter, METH_NOARGS, "Begin a step (the hot path)."},
    {"__exit__", (PyCFunction)(void (*)(void))StepCore_exit, METH_FASTCALL,
     "End a step (the hot path); never swallows an exception."},
    {"clock_ns", (PyCFunction)StepCore_clock_ns, METH_NOARGS | METH_STATIC,
     "The clock the hot path reads (CLOCK_MONOTONIC, in ns)."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef StepCore_members[] = {
    {"begun", T_LONGLONG, offsetof(StepCore, begun), 0, NULL},
    {"depth", T_LONGLONG, offsetof(StepCore, depth), 0, NULL},
    {"slow_from", T_LONGLONG, offsetof(StepCore, slow_from), 0, NULL},
    {"last_end_ns", T_LONGLONG, offsetof(StepCore, last_end_ns), 0, NULL},
    {"first_step", T_LONGLONG, offsetof(StepCore, first_step), 0, NULL},
    {"forwards_matched", T_LONGLONG, offsetof(StepCore, forwards_matched), 0, NULL},
    {"steady_forwards", T_LONGLONG, offsetof(StepCore, steady_forwards), 0, NULL},
    {"starts", T_OBJECT, offsetof(StepCore, starts), 0, NULL},
    {"timer", T_OBJECT, offsetof(StepCore, timer), 0, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject StepCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mfuscope.agent._step_core_c.StepCore",
    .tp_doc = "The step recorder's fields and its hot path (agent/_step_core.c).",
    .tp_basicsize = sizeof(StepCore),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)StepCore_dealloc,
    .tp_traverse = (traverseproc)StepCore_traverse,
    .tp_clear = (inquiry)StepCore_clear,
    .tp_methods = StepCore_methods,
    .tp_members = StepCore_members,
};

/* --- AgentCore: `agent.step()` ------------------------------------------------------------- */

/* The Agent's base: `step()` with no FLOPs given returns the agent's `_scope` (its step
 * recorder, or the disabled agent's no-op) without a Python frame; any argument goes to the
 * agent's Python `_given_step`, which checks it (agent/_agent.py). */
typedef struct {
    PyObject_HEAD
    PyObject *scope;
} AgentCore;

static PyObject *
AgentCore_step(AgentCore *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    if (PyVectorcall_NARGS(nargsf) == 0 && kwnames == NULL) {
        if (self->scope == NULL) {
            PyErr_SetString(PyExc_RuntimeError, "Agent.step() before the agent was set up");
            return NULL;
        }
        return Py_NewRef(self->scope);
    }
    PyObject *given = PyObject_GetAttrString((PyObject *)self, "_given_step");
    if (given == NULL) {
        return NULL;
    }
    PyObject *result = PyObject_Vectorcall(given, args, nargsf, kwnames);
    Py_DECREF(given);
    return result;
}

static int
AgentCore_traverse(AgentCore *self, visitproc visit, void *arg)
{
    Py_VISIT(self->scope);
    return 0;
}

static int
AgentCore_clear(AgentCore *self)
{
    Py_CLEAR(self->scope);
    return 0;
}

static void
AgentCore_dealloc(AgentCore *self)
{
    /* As StepCore_dealloc: reached through subtype_dealloc, which releases the heap type. */
    PyObject_GC_UnTrack(self);
    AgentCore_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

PyDoc_STRVAR(AgentCore_step_doc,
"step($self, /, flops=None, recompute_flops=None)\n--\n\n"
"Context manager around one training step (forward, backward, optimizer step).\n\n"
"`flops`: this rank's model FLOPs for this step (the MFU numerator; recomputation\n"
"excluded). It takes precedence over `flops_per_step` and over counting, and the step is\n"
"not counted. `recompute_flops`: the step's activation-recomputation FLOPs (HFU adds them;\n"
"default 0); only with `flops`. Each must be a finite number >= 0, else `InputError`.");

static PyMethodDef AgentCore_methods[] = {
    {"step", (PyCFunction)(void (*)(void))AgentCore_step, METH_FASTCALL | METH_KEYWORDS,
     AgentCore_step_doc},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef AgentCore_members[] = {
    {"_scope", T_OBJECT, offsetof(AgentCore, scope), 0, NULL},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject AgentCoreType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "mfuscope.agent._step_core_c.AgentCore",
    .tp_doc = "The Agent's `step()` (agent/_step_core.c).",
    .tp_basicsize = sizeof(AgentCore),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)AgentCore_dealloc,
    .tp_traverse = (traverseproc)AgentCore_traverse,
    .tp_clear = (inquiry)AgentCore_clear,
    .tp_methods = AgentCore_methods,
    .tp_members = AgentCore_members,
};

static PyMethodDef module_methods[] = {
    {"set_clock", set_clock, METH_O,
     "Read this callable (returning ns) instead of the real clock; None restores it (tests)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef step_core_module = {
    PyModuleDef_HEAD_INIT,
    .m_methods = module_methods,
    .m_name = "mfuscope.agent._step_core_c",
    .m_doc = "The step recorder's hot path in C (see agent/_step_core.c).",
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__step_core_c(void)
{
    name_begin_slow = PyUnicode_InternFromString("_begin_slow");
    name_exit_slow = PyUnicode_InternFromString("_exit_slow");
    name_device_mark = PyUnicode_InternFromString("_device_mark");
    if (name_begin_slow == NULL || name_exit_slow == NULL || name_device_mark == NULL ||
        PyType_Ready(&StepCoreType) < 0 || PyType_Ready(&AgentCoreType) < 0) {
        return NULL;
    }
    PyObject *module = PyModule_Create(&step_core_module);
    if (module == NULL) {
        return NULL;
    }
    if (PyModule_AddIntConstant(module, "RING_SLOTS", RING_SLOTS) < 0 ||
        PyModule_AddIntConstant(module, "OUTSIDE", OUTSIDE) < 0 ||
        PyModule_AddObjectRef(module, "StepCore", (PyObject *)&StepCoreType) < 0 ||
        PyModule_AddObjectRef(module, "AgentCore", (PyObject *)&AgentCoreType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}

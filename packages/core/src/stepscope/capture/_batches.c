/* The routine batches of a framework callback in C: `Batches` (capture/routine_batches.py
   says what a routine batch is, why it is run apart from the step driver, and how it is
   armed). Its results are the step driver's (packages/tf_plugin/tests/test_routine_batches.py).

   Why C: a callback's batch hooks run right after the framework's compiled step, when each
   object they touch is a cache miss. Here a routine step reads and writes the hook's
   StepCounters and a new StepState at their __slots__ offsets (found once, from their
   types' member descriptors), and touches nothing else of the hook's, without a frame:
   4-6 us a step less than the same steps in Python (routine_batches.PythonBatches).

   Each call checks all of its conditions before it changes anything and returns False when
   one fails (the caller then takes the step driver's path, which finds the state it would
   have found without this module). A failure of the timeline's clock or log goes to
   `timeline_failed` (the hook's), as on the driver's path; any other failure raises, and
   the callback hands it to the hook's fail-safe. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <limits.h>
#include <time.h>

#ifdef Py_GIL_DISABLED
#error "the routine batches rely on the GIL; free-threaded builds use the Python path"
#endif

#ifndef Py_T_OBJECT_EX  /* before 3.12 */
#define Py_T_OBJECT_EX T_OBJECT_EX
#endif

#define MODES 5  /* ModeKeys are 1..4; tables are indexed by the mode's number */

/* One callback's routine batches: what it calls (the hook's counters, fail-safes and
   methods), the phase log's record codes and the "compute" phase (stepscope.capture.phases,
   given at construction), the slots' offsets, the armed runs and the ended steps. */
typedef struct {
    PyObject_HEAD
    PyObject *counters, *failsafe, *profiler_failsafe;
    PyObject *timeline_failed, *meter_block, *release;
    PyTypeObject *step_type;
    PyObject *begin_code, *enter_code, *end_code, *compute_code;
    /* __slots__ offsets: the counters' fields, the fail-safes' `enabled`, the step's fields */
    Py_ssize_t c_step, c_idle, c_global_step, c_mode, c_begun, c_next_due, c_closed, c_detailed, c_meter_at, c_now, c_log_append,
        c_timing, c_last_end, f_enabled, s_global_step, s_mode, s_mode_step, s_due, s_due_names, s_tensors, s_shapes;
    /* the armed runs, per mode: mode steps [first, until), the due collections, their names, the log plans */
    long long first[MODES], until[MODES];
    PyObject *due[MODES], *names[MODES], *plans[MODES];
    char idle[MODES];                 /* the mode's steps where nothing is due run here too */
    PyObject *switches;               /* a tuple of objects whose `on` must be False */
    PyObject *open;                   /* the step begin() opened, until end() ends it */
    int open_mode;
    char open_idle;                   /* it is the counters' shared idle step */
    PyObject *held;                   /* ended steps, for HeldSteps to take */
    long long first_held_ns;
    Py_ssize_t hold_steps, max_values;
    unsigned long long steps;
} Batches;

static PyObject *perf_counter_ns, *str_on;
/* time.perf_counter_ns(): read here on Linux (CLOCK_MONOTONIC is CPython's clock there),
   asked of CPython elsewhere (macOS and Windows use other clocks). */
static inline long long
monotonic_ns(void)
{
#ifdef __linux__
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
#else
    PyObject *reading = PyObject_CallNoArgs(perf_counter_ns);
    long long ns = reading != NULL ? PyLong_AsLongLong(reading) : -1;
    Py_XDECREF(reading);
    if (ns < 0) {  /* (only timing is lost: the cost meter's sample, a held step's age) */
        PyErr_Clear();
        ns = 0;
    }
    return ns;
#endif
}

#define SLOT(obj, offset) (*(PyObject **)((char *)(obj) + (offset)))

/* Replace a __slots__ member's value (`value`: a new reference, taken). */
static inline void
set_slot(PyObject *obj, Py_ssize_t offset, PyObject *value)
{
    PyObject *old = SLOT(obj, offset);
    SLOT(obj, offset) = value;
    Py_XDECREF(old);
}

/* The offset of `type`'s __slots__ member `name`, or -1 with TypeError set. */
static Py_ssize_t
slot_offset(PyTypeObject *type, const char *name)
{
    PyObject *descr = PyObject_GetAttrString((PyObject *)type, name);
    if (descr == NULL)
        return -1;
    Py_ssize_t offset = -1;
    if (Py_IS_TYPE(descr, &PyMemberDescr_Type) && ((PyMemberDescrObject *)descr)->d_member->type == Py_T_OBJECT_EX)
        offset = ((PyMemberDescrObject *)descr)->d_member->offset;
    Py_DECREF(descr);
    if (offset < 0)
        PyErr_Format(PyExc_TypeError, "Batches: %s.%s is not a __slots__ member", type->tp_name, name);
    return offset;
}

static inline int
enabled(Batches *b, PyObject *failsafe)
{
    PyObject *value = SLOT(failsafe, b->f_enabled);
    return value == Py_True;
}

/* A plain int's value into *out; 0 when it is not one (or does not fit). */
static inline int
as_long_long(PyObject *value, long long *out)
{
    if (value == NULL || !PyLong_CheckExact(value))
        return 0;
    int overflow;
    *out = PyLong_AsLongLongAndOverflow(value, &overflow);
    return !overflow && !(*out == -1 && PyErr_Occurred());
}

/* The mode's index in the tables, or 0 (no such mode). */
static inline int
mode_index(PyObject *mode)
{
    if (!PyLong_Check(mode))
        return 0;
    long m = PyLong_AsLong(mode);
    if (m == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return m >= 1 && m < MODES ? (int)m : 0;
}

/* The clock and log failed (an exception is set): the hook's _timeline_failed(exc). 0, or
   -1 when that raised too. */
static int
timeline_failed(Batches *b)
{
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyErr_NormalizeException(&type, &value, &traceback);
    if (traceback != NULL && value != NULL)
        PyException_SetTraceback(value, traceback);
    PyObject *done = value != NULL ? PyObject_CallOneArg(b->timeline_failed, value) : NULL;
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(traceback);
    if (done == NULL)
        return -1;
    Py_DECREF(done);
    return 0;
}

/* now() of the counters' clock: perf_counter_ns read here, another clock called. */
static PyObject *
read_clock(PyObject *now)
{
#ifdef __linux__
    if (now == perf_counter_ns)
        return PyLong_FromLongLong(monotonic_ns());
#endif
    return PyObject_CallNoArgs(now);
}

/* ---- begin ------------------------------------------------------------------------------ */

static PyObject *
Batches_begin(Batches *b, PyObject *mode)
{
    int m = mode_index(mode);
    if (m == 0 || (b->names[m] == NULL && !b->idle[m]))
        Py_RETURN_FALSE;
    PyObject *c = b->counters;
    if (SLOT(c, b->c_step) != Py_None)
        Py_RETURN_FALSE;
    PyObject *begun = SLOT(c, b->c_begun), *next_due = SLOT(c, b->c_next_due);
    if (begun == NULL || next_due == NULL || !PyList_CheckExact(begun) || !PyList_CheckExact(next_due) || PyList_GET_SIZE(begun) <= m
        || PyList_GET_SIZE(next_due) <= m)
        Py_RETURN_FALSE;
    long long mode_step, global_step, meter_at;
    PyObject *global_obj = SLOT(c, b->c_global_step), *mode_step_obj = PyList_GET_ITEM(begun, m);
    if (!as_long_long(mode_step_obj, &mode_step) || !as_long_long(global_obj, &global_step) || !as_long_long(SLOT(c, b->c_meter_at), &meter_at)) {
        PyErr_Clear();
        Py_RETURN_FALSE;
    }
    /* A step of the armed run (due: a new step), else, where allowed, one before the next due
       step (nothing due: the counters' shared idle step, as StepDriver._open_step opens it). */
    int idle = 0;
    if (b->names[m] == NULL || mode_step < b->first[m] || mode_step >= b->until[m]) {
        PyObject *next = PyList_GET_ITEM(next_due, m);
        long long next_step;
        if (!b->idle[m] || !(next == Py_None || (as_long_long(next, &next_step) && mode_step < next_step))) {
            PyErr_Clear();
            Py_RETURN_FALSE;
        }
        idle = 1;
    }
    if (SLOT(c, b->c_closed) != Py_False || SLOT(c, b->c_detailed) != Py_None || !enabled(b, b->failsafe) || SLOT(c, b->c_idle) == Py_None)
        Py_RETURN_FALSE;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(b->switches); i++) {
        PyObject *on = PyObject_GetAttr(PyTuple_GET_ITEM(b->switches, i), str_on);
        if (on == NULL)
            return NULL;
        int is_on = PyObject_IsTrue(on);
        Py_DECREF(on);
        if (is_on != 0) {  /* (a capture still on after a step that saved tensors: the hook switches it off) */
            if (is_on < 0)
                return NULL;
            Py_RETURN_FALSE;
        }
    }
    /* Everything checked: the step opens. Made first, so that nothing changes when it cannot be. */
    PyObject *tensors = idle ? NULL : PyDict_New(), *shapes = idle ? NULL : PyDict_New(), *step;
    if (idle) {
        step = SLOT(c, b->c_idle);
        Py_INCREF(step);
    }
    else
        step = tensors != NULL && shapes != NULL ? b->step_type->tp_alloc(b->step_type, 0) : NULL;
    PyObject *next_number = PyLong_FromLongLong(mode_step + 1), *next_global = PyLong_FromLongLong(global_step + 1);
    if (step == NULL || next_number == NULL || next_global == NULL) {
        Py_XDECREF(tensors);
        Py_XDECREF(shapes);
        Py_XDECREF(step);
        Py_XDECREF(next_number);
        Py_XDECREF(next_global);
        return NULL;
    }
    long long started = global_step >= meter_at ? monotonic_ns() : -1;  /* (the cost meter times this one) */
    PyObject *now = SLOT(c, b->c_now);
    if (now != Py_None && enabled(b, b->profiler_failsafe)) {
        PyObject *token = read_clock(now), *done = NULL;
        if (token != NULL) {
            PyObject *last_end = SLOT(c, b->c_last_end);
            /* The step's begin and its "compute" phase in one call (a flat log's records are words). */
            PyObject *record = PyTuple_Pack(7, b->begin_code, global_obj, mode, last_end == Py_None ? token : last_end, b->enter_code,
                                            b->compute_code, token);
            PyObject *append = SLOT(c, b->c_log_append);
            done = record != NULL ? PyObject_CallOneArg(append, record) : NULL;
            Py_XDECREF(record);
            Py_DECREF(token);
        }
        if (done != NULL) {
            Py_DECREF(done);
            Py_INCREF(Py_True);
            set_slot(c, b->c_timing, Py_True);
        }
        else if (timeline_failed(b) < 0) {
            Py_XDECREF(tensors);
            Py_XDECREF(shapes);
            Py_DECREF(step);
            Py_DECREF(next_number);
            Py_DECREF(next_global);
            return NULL;
        }
    }
    if (!idle) {
        /* The step's fields (StepState's __init__, without its frame). */
        PyObject *fields[] = {global_obj, mode, mode_step_obj, b->due[m], b->names[m]};
        Py_ssize_t offsets[] = {b->s_global_step, b->s_mode, b->s_mode_step, b->s_due, b->s_due_names};
        for (int i = 0; i < 5; i++) {
            Py_INCREF(fields[i]);
            set_slot(step, offsets[i], fields[i]);
        }
        set_slot(step, b->s_tensors, tensors);
        set_slot(step, b->s_shapes, shapes);
    }
    /* The counters (StepDriver._open_step; in a run of due steps, _due_at's next due step). */
    Py_INCREF(mode);
    set_slot(c, b->c_mode, mode);
    if (idle)
        PyList_SetItem(begun, m, next_number);
    else {
        Py_INCREF(next_number);
        PyList_SetItem(begun, m, next_number);
        PyList_SetItem(next_due, m, next_number);
    }
    set_slot(c, b->c_global_step, next_global);
    Py_INCREF(step);
    set_slot(c, b->c_step, step);
    Py_XSETREF(b->open, step);
    b->open_mode = m;
    b->open_idle = (char)idle;
    b->steps++;
    if (started >= 0) {
        long long elapsed = monotonic_ns() - started;
        PyObject *done = PyObject_CallFunction(b->meter_block, "OddO", global_obj, started / 1e9, elapsed / 1e9, Py_True);
        if (done == NULL)
            return NULL;
        Py_DECREF(done);
    }
    Py_RETURN_TRUE;
}

/* ---- end -------------------------------------------------------------------------------- */

/* StepDriver.finish_step_timing: the open step's timeline ends now. 0, or -1 to raise. */
static int
finish_timing(Batches *b)
{
    PyObject *c = b->counters;
    PyObject *token = read_clock(SLOT(c, b->c_now)), *done = NULL;
    if (token != NULL) {
        PyObject *record = PyTuple_Pack(2, b->end_code, token);
        done = record != NULL ? PyObject_CallOneArg(SLOT(c, b->c_log_append), record) : NULL;
        Py_XDECREF(record);
    }
    if (done == NULL) {
        Py_XDECREF(token);
        return timeline_failed(b);
    }
    Py_DECREF(done);
    set_slot(c, b->c_last_end, token);  /* (the reference taken) */
    Py_INCREF(Py_False);
    set_slot(c, b->c_timing, Py_False);
    return 0;
}

static PyObject *
Batches_end(Batches *b, PyObject *logs)
{
    PyObject *step = b->open;
    if (step == NULL)
        Py_RETURN_FALSE;
    PyObject *c = b->counters;
    int m = b->open_mode;
    if (SLOT(c, b->c_step) != step) {
        Py_CLEAR(b->open);
        Py_RETURN_FALSE;
    }
    if (b->open_idle) {
        /* Nothing is due: the logs are not saved (HookBase.save_logs), the timeline ends. */
        if (!enabled(b, b->failsafe))
            Py_RETURN_FALSE;
        if (SLOT(c, b->c_timing) == Py_True && finish_timing(b) < 0)
            return NULL;
        Py_INCREF(Py_None);
        set_slot(c, b->c_step, Py_None);
        Py_CLEAR(b->open);
        Py_RETURN_TRUE;
    }
    PyObject *tensors = SLOT(step, b->s_tensors), *shapes = SLOT(step, b->s_shapes), *plans = b->plans[m];
    if (b->names[m] == NULL || SLOT(step, b->s_due_names) != b->names[m] || tensors == NULL || shapes == NULL || !PyDict_CheckExact(tensors)
        || !PyDict_CheckExact(shapes) || PyDict_GET_SIZE(tensors) || PyDict_GET_SIZE(shapes) || !enabled(b, b->failsafe))
        Py_RETURN_FALSE;  /* (something was saved into it besides the logs: the driver hands it over) */
    if (logs != Py_None) {
        if (!PyDict_CheckExact(logs) || PyDict_GET_SIZE(logs) > b->max_values)
            Py_RETURN_FALSE;
        Py_ssize_t position = 0;
        PyObject *name, *value;
        while (PyDict_Next(logs, &position, &name, &value)) {
            if (!PyFloat_CheckExact(value) || !PyUnicode_CheckExact(name))
                Py_RETURN_FALSE;
            PyObject *flag = PyDict_GetItemWithError(plans, name);
            if (flag == NULL) {
                if (PyErr_Occurred())
                    return NULL;
                Py_RETURN_FALSE;  /* (the driver's path plans a new name; the next step finds it here) */
            }
        }
    }
    Py_INCREF(step);  /* (ours until it is held or dropped) */
    if (SLOT(c, b->c_timing) == Py_True && finish_timing(b) < 0) {
        Py_DECREF(step);
        return NULL;
    }
    if (logs != Py_None) {
        Py_ssize_t position = 0;
        PyObject *name, *value;
        while (PyDict_Next(logs, &position, &name, &value)) {
            PyObject *flag = PyDict_GetItemWithError(plans, name);
            if (flag == Py_True && PyDict_SetItem(tensors, name, value) < 0) {
                Py_DECREF(step);
                return NULL;
            }
        }
    }
    Py_INCREF(Py_None);
    set_slot(c, b->c_step, Py_None);
    Py_CLEAR(b->open);
    int failed = 0;
    if (PyDict_GET_SIZE(tensors)) {
        PyObject *record = PyTuple_Pack(5, SLOT(step, b->s_global_step), SLOT(step, b->s_mode), SLOT(step, b->s_mode_step), tensors, shapes);
        if (PyList_GET_SIZE(b->held) == 0)
            b->first_held_ns = monotonic_ns();
        failed = record == NULL || PyList_Append(b->held, record) < 0;
        Py_XDECREF(record);
        /* By count here; by age (HOLD_S since the first) on HeldSteps' own thread, which asks held_age(). */
        if (!failed && PyList_GET_SIZE(b->held) >= b->hold_steps) {
            PyObject *done = PyObject_CallNoArgs(b->release);
            failed = done == NULL;
            Py_XDECREF(done);
        }
    }
    Py_DECREF(step);
    if (failed)
        return NULL;
    Py_RETURN_TRUE;
}

/* ---- arming and HeldSteps' source --------------------------------------------------------- */

static PyObject *
Batches_set_run(Batches *b, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6) {
        PyErr_SetString(PyExc_TypeError, "set_run(mode, first, until, due, names, plans)");
        return NULL;
    }
    int m = mode_index(args[0]);
    long long first, until;
    if (m == 0 || !as_long_long(args[1], &first)) {
        PyErr_Clear();
        PyErr_SetString(PyExc_ValueError, "set_run: a mode and an int first step");
        return NULL;
    }
    if (PyFloat_Check(args[2]) && PyFloat_AS_DOUBLE(args[2]) == Py_HUGE_VAL)
        until = LLONG_MAX;
    else if (!as_long_long(args[2], &until)) {
        PyErr_Clear();
        PyErr_SetString(PyExc_ValueError, "set_run: until must be an int or inf");
        return NULL;
    }
    if (!PyTuple_Check(args[3]) || !PyDict_CheckExact(args[5])) {
        PyErr_SetString(PyExc_TypeError, "set_run: due must be a tuple and plans a dict");
        return NULL;
    }
    b->first[m] = first;
    b->until[m] = until;
    PyObject **fields[] = {&b->due[m], &b->names[m], &b->plans[m]};
    for (int i = 0; i < 3; i++) {
        Py_INCREF(args[3 + i]);
        Py_XSETREF(*fields[i], args[3 + i]);
    }
    Py_RETURN_NONE;
}

static PyObject *
Batches_drop_run(Batches *b, PyObject *mode)
{
    int m = mode_index(mode);
    if (m != 0) {
        Py_CLEAR(b->due[m]);
        Py_CLEAR(b->names[m]);
        Py_CLEAR(b->plans[m]);
    }
    Py_RETURN_NONE;
}

static PyObject *
Batches_set_idle(Batches *b, PyObject *const *args, Py_ssize_t nargs)
{
    int m = nargs == 2 ? mode_index(args[0]) : 0;
    if (m == 0) {
        PyErr_SetString(PyExc_TypeError, "set_idle(mode, allowed)");
        return NULL;
    }
    int allowed = PyObject_IsTrue(args[1]);
    if (allowed < 0)
        return NULL;
    b->idle[m] = (char)allowed;
    Py_RETURN_NONE;
}

static PyObject *
Batches_run_plans(Batches *b, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "run_plans(mode, names)");
        return NULL;
    }
    int m = mode_index(args[0]);
    if (m == 0 || b->names[m] == NULL || b->names[m] != args[1])
        Py_RETURN_NONE;
    Py_INCREF(b->plans[m]);
    return b->plans[m];
}

static PyObject *
Batches_set_switches(Batches *b, PyObject *switches)
{
    if (!PyTuple_Check(switches)) {
        PyErr_SetString(PyExc_TypeError, "set_switches: a tuple");
        return NULL;
    }
    Py_INCREF(switches);
    Py_XSETREF(b->switches, switches);
    Py_RETURN_NONE;
}

static PyObject *
Batches_set_hold_steps(Batches *b, PyObject *value)
{
    Py_ssize_t n = PyLong_AsSsize_t(value);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    b->hold_steps = n < 1 ? 1 : n;
    Py_RETURN_NONE;
}

static PyObject *
Batches_take_held(Batches *b, PyObject *unused)
{
    PyObject *fresh = PyList_New(0);
    if (fresh == NULL)
        return NULL;
    PyObject *taken = b->held;  /* (with the GIL held: no step is appended meanwhile) */
    b->held = fresh;
    return taken;
}

static PyObject *
Batches_held_age(Batches *b, PyObject *unused)
{
    if (PyList_GET_SIZE(b->held) == 0)
        Py_RETURN_NONE;
    return PyFloat_FromDouble((monotonic_ns() - b->first_held_ns) / 1e9);
}

/* ---- the type ----------------------------------------------------------------------------- */

static PyObject *
Batches_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *keywords[] = {"counters", "failsafe", "profiler_failsafe", "timeline_failed", "meter_block", "release", "step_type", "codes",
                               "max_values", NULL};
    PyObject *counters, *failsafe, *profiler_failsafe, *timeline_failed_fn, *meter_block, *release, *step_type, *codes;
    Py_ssize_t max_values;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOOOO!O!n:Batches", keywords, &counters, &failsafe, &profiler_failsafe, &timeline_failed_fn,
                                     &meter_block, &release, &PyType_Type, &step_type, &PyTuple_Type, &codes, &max_values))
        return NULL;
    if (Py_TYPE(failsafe) != Py_TYPE(profiler_failsafe)) {
        PyErr_SetString(PyExc_TypeError, "Batches: the two fail-safes must be of one type");
        return NULL;
    }
    if (PyTuple_GET_SIZE(codes) != 4) {
        PyErr_SetString(PyExc_TypeError, "Batches: codes are (begin, enter, end, compute)");
        return NULL;
    }
    PyTypeObject *st = (PyTypeObject *)step_type;
    if (st->tp_dictoffset != 0) {
        PyErr_Format(PyExc_TypeError, "Batches: %s must have __slots__ only", st->tp_name);
        return NULL;
    }
    Batches *b = (Batches *)type->tp_alloc(type, 0);
    if (b == NULL)
        return NULL;
    static const char *counter_fields[] = {"step", "idle", "global_step", "mode", "begun", "next_due", "closed", "detailed", "meter_at", "now",
                                           "log_append", "timing", "last_end"};
    Py_ssize_t *counter_offsets[] = {&b->c_step, &b->c_idle, &b->c_global_step, &b->c_mode, &b->c_begun, &b->c_next_due, &b->c_closed, &b->c_detailed,
                                     &b->c_meter_at, &b->c_now, &b->c_log_append, &b->c_timing, &b->c_last_end};
    for (size_t i = 0; i < sizeof(counter_fields) / sizeof(counter_fields[0]); i++)
        if ((*counter_offsets[i] = slot_offset(Py_TYPE(counters), counter_fields[i])) < 0)
            goto error;
    static const char *step_fields[] = {"global_step", "mode", "mode_step", "due", "due_names", "tensors", "shapes"};
    Py_ssize_t *step_offsets[] = {&b->s_global_step, &b->s_mode, &b->s_mode_step, &b->s_due, &b->s_due_names, &b->s_tensors, &b->s_shapes};
    for (size_t i = 0; i < sizeof(step_fields) / sizeof(step_fields[0]); i++)
        if ((*step_offsets[i] = slot_offset(st, step_fields[i])) < 0)
            goto error;
    if ((b->f_enabled = slot_offset(Py_TYPE(failsafe), "enabled")) < 0)
        goto error;
    /* Every field the hot path reads must be set: an unset __slots__ member is NULL. */
    for (size_t i = 0; i < sizeof(counter_fields) / sizeof(counter_fields[0]); i++)
        if (SLOT(counters, *counter_offsets[i]) == NULL) {
            PyErr_Format(PyExc_TypeError, "Batches: the counters' %s is not set", counter_fields[i]);
            goto error;
        }
    if (SLOT(failsafe, b->f_enabled) == NULL || SLOT(profiler_failsafe, b->f_enabled) == NULL) {
        PyErr_SetString(PyExc_TypeError, "Batches: a fail-safe's enabled is not set");
        goto error;
    }
    PyObject **given[] = {&b->counters, &b->failsafe, &b->profiler_failsafe, &b->timeline_failed, &b->meter_block, &b->release,
                          &b->begin_code, &b->enter_code, &b->end_code, &b->compute_code};
    PyObject *values[] = {counters, failsafe, profiler_failsafe, timeline_failed_fn, meter_block, release, PyTuple_GET_ITEM(codes, 0),
                          PyTuple_GET_ITEM(codes, 1), PyTuple_GET_ITEM(codes, 2), PyTuple_GET_ITEM(codes, 3)};
    for (size_t i = 0; i < sizeof(given) / sizeof(given[0]); i++) {
        Py_INCREF(values[i]);
        *given[i] = values[i];
    }
    Py_INCREF(step_type);
    b->step_type = st;
    b->switches = PyTuple_New(0);
    b->held = PyList_New(0);
    if (b->switches == NULL || b->held == NULL)
        goto error;
    b->hold_steps = 100;
    b->max_values = max_values;
    return (PyObject *)b;
error:
    Py_DECREF(b);
    return NULL;
}

static int
Batches_traverse(Batches *b, visitproc visit, void *arg)
{
    Py_VISIT(b->counters);
    Py_VISIT(b->failsafe);
    Py_VISIT(b->profiler_failsafe);
    Py_VISIT(b->timeline_failed);
    Py_VISIT(b->meter_block);
    Py_VISIT(b->release);
    Py_VISIT(b->step_type);
    Py_VISIT(b->switches);
    Py_VISIT(b->open);
    Py_VISIT(b->held);
    for (int m = 0; m < MODES; m++) {
        Py_VISIT(b->due[m]);
        Py_VISIT(b->names[m]);
        Py_VISIT(b->plans[m]);
    }
    return 0;
}

static int
Batches_clear(Batches *b)
{
    Py_CLEAR(b->counters);
    Py_CLEAR(b->failsafe);
    Py_CLEAR(b->profiler_failsafe);
    Py_CLEAR(b->timeline_failed);
    Py_CLEAR(b->meter_block);
    Py_CLEAR(b->release);
    Py_CLEAR(b->step_type);
    Py_CLEAR(b->switches);
    Py_CLEAR(b->open);
    Py_CLEAR(b->held);
    Py_CLEAR(b->begin_code);
    Py_CLEAR(b->enter_code);
    Py_CLEAR(b->end_code);
    Py_CLEAR(b->compute_code);
    for (int m = 0; m < MODES; m++) {
        Py_CLEAR(b->due[m]);
        Py_CLEAR(b->names[m]);
        Py_CLEAR(b->plans[m]);
    }
    return 0;
}

static void
Batches_dealloc(Batches *b)
{
    PyObject_GC_UnTrack(b);
    Batches_clear(b);
    Py_TYPE(b)->tp_free((PyObject *)b);
}

static PyObject *
Batches_get_steps(Batches *b, void *closure)
{
    return PyLong_FromUnsignedLongLong(b->steps);
}

static PyMethodDef Batches_methods[] = {
    {"begin", (PyCFunction)Batches_begin, METH_O, "Open the next step of `mode` when it is routine (True); False: nothing changed."},
    {"end", (PyCFunction)Batches_end, METH_O, "End the step begin() opened, saving `logs` into it, when that is all there is to do."},
    {"set_run", (PyCFunction)(void (*)(void))Batches_set_run, METH_FASTCALL, "Arm mode's run: set_run(mode, first, until, due, names, plans)."},
    {"drop_run", (PyCFunction)Batches_drop_run, METH_O, "Disarm mode's run."},
    {"set_idle", (PyCFunction)(void (*)(void))Batches_set_idle, METH_FASTCALL, "Whether mode's steps where nothing is due run here: set_idle(mode, allowed)."},
    {"run_plans", (PyCFunction)(void (*)(void))Batches_run_plans, METH_FASTCALL, "The log plans of mode's run when it is armed for `names`, else None."},
    {"set_switches", (PyCFunction)Batches_set_switches, METH_O, "The captures' switches, which a routine step must find off."},
    {"set_hold_steps", (PyCFunction)Batches_set_hold_steps, METH_O, "Call release() once this many ended steps are held."},
    {"take_held", (PyCFunction)Batches_take_held, METH_NOARGS, "The steps ended here since the last take, oldest first."},
    {"held_age", (PyCFunction)Batches_held_age, METH_NOARGS, "Seconds since the oldest step not yet taken ended, None when none waits."},
    {NULL},
};

static PyGetSetDef Batches_getset[] = {
    {"steps", (getter)Batches_get_steps, NULL, "Steps opened here.", NULL},
    {NULL},
};

static PyTypeObject BatchesType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "stepscope.capture._batches.Batches",
    .tp_doc = "The routine batches of a framework callback (capture/routine_batches.py).",
    .tp_basicsize = sizeof(Batches),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = Batches_new,
    .tp_dealloc = (destructor)Batches_dealloc,
    .tp_traverse = (traverseproc)Batches_traverse,
    .tp_clear = (inquiry)Batches_clear,
    .tp_methods = Batches_methods,
    .tp_getset = Batches_getset,
};

static struct PyModuleDef batches_module = {
    PyModuleDef_HEAD_INIT, "_batches", "The routine batches of a framework callback in C (routine_batches.py).", -1, NULL,
};

PyMODINIT_FUNC
PyInit__batches(void)
{
    if (PyType_Ready(&BatchesType) < 0)
        return NULL;
    PyObject *time = PyImport_ImportModule("time");
    if (time == NULL)
        return NULL;
    perf_counter_ns = PyObject_GetAttrString(time, "perf_counter_ns");
    Py_DECREF(time);
    str_on = PyUnicode_InternFromString("on");
    if (perf_counter_ns == NULL || str_on == NULL)
        return NULL;
    PyObject *module = PyModule_Create(&batches_module);
    if (module == NULL)
        return NULL;
    Py_INCREF(&BatchesType);
    if (PyModule_AddObject(module, "Batches", (PyObject *)&BatchesType) < 0) {
        Py_DECREF(&BatchesType);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}

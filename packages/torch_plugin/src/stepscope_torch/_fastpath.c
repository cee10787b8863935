/* The compiled hot path of stepscope_torch.Hook (see fastpath.py).

   `Counters` holds the hook's per-step state (the fields of fastpath.TorchCounters) in one
   C struct, and is the torch entry points of a step: the driven model's `forward` and the
   optimizer's step hooks. Each does its routine case itself (a step where nothing is due,
   after one where nothing was: a few integers and, with the step timeline, a clock
   reading appended to the phase log) and hands every other case, unchanged, to the
   hook's Python method for it (`attach`): a step that saves and the one after it, a stop
   decision, a closed or failed hook, a profiling window, a state of an unexpected type.
   (Steps without a registered optimizer, ended by the next forward, are routine too; so
   are the cost meter's timed steps, timed here and handed to `HookBase._meter_block`.)
   A routine case checks all of its conditions before it changes anything, so the Python
   method always finds the state it would have found without this module; a failure of
   the timeline's clock or log in one goes to the profiler's fail-safe, as in Python.

   Why one struct: after the framework's own step has run, each object the hook touches is
   a cache miss; the reads and writes of a routine step stay within a few cache lines
   here, where the same work over Python objects touched a few dozen. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <limits.h>
#include <time.h>

#ifdef Py_GIL_DISABLED
#error "the hot path relies on the GIL; free-threaded builds use the Python path"
#endif

#ifndef Py_T_OBJECT_EX  /* before 3.12 */
#define Py_T_OBJECT_EX T_OBJECT_EX
#define Py_T_LONGLONG T_LONGLONG
#define Py_T_ULONGLONG T_ULONGLONG
#define Py_T_BOOL T_BOOL
#define Py_READONLY READONLY
#endif

#if defined(__GNUC__)
#define UNLIKELY(x) __builtin_expect(!!(x), 0)
#define COLD __attribute__((cold, noinline))
#else
#define UNLIKELY(x) (x)
#define COLD
#endif

#define MODES 5           /* ModeKeys are 1..4; tables are indexed by the mode's number */
#define NONE_DUE LLONG_MIN /* next_due[mode] is None: nothing is ever due in that mode */

enum { CODE_FORWARD_BEGIN, CODE_FORWARD_END, CODE_OPTIMIZER_BEGIN, CODE_STEP_END, CODE_BEGIN_EVENT, CODES };
static const char *code_names[CODES] = {"forward_begin", "forward_end", "optimizer_begin", "step_end", "begin_event"};

typedef struct {
    PyObject_HEAD
    /* what a routine step reads and writes, first (a few cache lines) */
    long long global_step, train_at, train_ends, stop_check_at, meter_at;
    char closed, notify, timing, drives_optimizer;
    char clock_is_perf_counter;        /* now is time.perf_counter_ns: read the clock here */
    char last_end_is_ns;               /* last_end is last_end_ns (else the object) */
    long long last_end_ns;
    PyObject *step, *idle, *mode, *explicit_mode, *last_end;
    PyObject *failsafe, *profiler_failsafe, *detailed;
    PyObject *words;                   /* the Words whose extend is log_append, else NULL */
    PyObject *now, *log_append;
    long long code_values[CODES];
    long long begun[MODES], next_due[MODES];
    Py_ssize_t enabled_offset;         /* FailSafe.enabled (a __slots__ member) */
    PyTypeObject *failsafe_type;
    /* set once */
    PyObject *train, *eval, *codes[CODES];
    PyObject *begun_table, *next_due_table;
    PyObject *slow_begin, *slow_end, *slow_pre, *slow_post;
    PyObject *meter_block;             /* HookBase._meter_block, for the steps timed here */
    unsigned long long routine, handed_over, scalar_steps;
    /* Compiled scalar steps (see "scalar steps" below): set by arm_scalar_run. */
    PyObject *scalar_step;             /* the open step, while it is one this path runs (else NULL) */
    PyObject *scalar_tensors, *scalar_shapes;  /* its dicts */
    long long scalar_global_step, scalar_mode_step;
    char loss_armed;                   /* its loss modules save their output (until the update) */
    int scalar_m;                      /* the run's mode index; 0: no run armed */
    long long scalar_first, scalar_until;  /* the run's mode steps [first, until) */
    PyObject *scalar_mode, *scalar_due, *scalar_names;  /* the run's mode, the collections due, their names */
    PyObject *optimizer;               /* the one registered optimizer (its state's size is watched), else NULL */
    Py_ssize_t optimizer_states;
    PyObject *held;                    /* ended scalar steps, for HeldSteps to take (take_held) */
    long long held_first_ns, hold_ns;
    Py_ssize_t hold_steps;
    PyObject *release;                 /* what hands the held steps to the writer */
    /* set once (setup_scalar_steps) */
    PyObject *step_type, *adopt;       /* StepState; Hook._adopt_step */
    PyObject *plain_scalars, *strided, *held_types, *array_type;
    Py_ssize_t max_values, max_bytes;
} Counters;

/* counters.begun / counters.next_due as Python sees them: views of the arrays above. */
typedef struct {
    PyObject_HEAD
    Counters *owner;
    long long *values;
} ModeTable;

static PyTypeObject CountersType, ModeTableType, DrivenForwardType, BoundForwardType;
static PyObject *str_training, *str_fail, *perf_counter_ns, *perf_counter, *is_grad_enabled;
static PyObject *str_is_cpu, *str_layout, *str_dtype, *str_dim, *str_item, *str_tensors, *str_shapes, *str_due_names, *str_state;
static PyObject *tensor_type, *empty_tuple;

/* ---- small helpers ------------------------------------------------------------------- */

/* Whether a FailSafe says enabled (0 for anything that is not one). */
static inline int
failsafe_enabled(Counters *c, PyObject *failsafe)
{
    if (UNLIKELY(Py_TYPE(failsafe) != c->failsafe_type))
        return 0;
    return *(PyObject **)((char *)failsafe + c->enabled_offset) == Py_True;
}

/* The mode's index in the tables, or -1. */
static inline int
mode_index(Counters *c, PyObject *mode)
{
    if (mode == c->train)
        return 1;
    if (mode == c->eval)
        return 2;
    if (!PyLong_Check(mode))
        return -1;
    long index = PyLong_AsLong(mode);
    if (index < 1 || index >= MODES) {
        PyErr_Clear();
        return -1;
    }
    return (int)index;
}

static inline void
replace(PyObject **field, PyObject *value)  /* value: a new reference */
{
    PyObject *old = *field;
    *field = value;
    Py_XDECREF(old);
}

static inline long long
monotonic_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* ---- Words: the phase log's words as int64s (phases.Words in C) --------------------- */

typedef struct {
    PyObject_HEAD
    long long *data;
    Py_ssize_t len, cap;
} Words;

static int
words_reserve(Words *w, Py_ssize_t extra)
{
    if (w->len + extra <= w->cap)
        return 0;
    Py_ssize_t cap = w->cap < 1024 ? 1024 : w->cap;
    while (cap < w->len + extra)
        cap *= 2;
    long long *data = PyMem_Realloc(w->data, cap * sizeof(long long));
    if (data == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    w->data = data;
    w->cap = cap;
    return 0;
}

static inline int
words_push(Words *w, const long long *values, Py_ssize_t n)
{
    if (UNLIKELY(w->len + n > w->cap) && words_reserve(w, n) < 0)
        return -1;
    memcpy(w->data + w->len, values, n * sizeof(long long));
    w->len += n;
    return 0;
}

/* words.extend(record): what the Python path appends (a tuple of ints). All or nothing. */
static PyObject *
Words_extend(Words *w, PyObject *items)
{
    PyObject *sequence = PySequence_Fast(items, "Words.extend: expected a sequence of ints");
    if (sequence == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(sequence);
    PyObject **item = PySequence_Fast_ITEMS(sequence);
    if (words_reserve(w, n) < 0) {
        Py_DECREF(sequence);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        long long value = PyLong_AsLongLong(item[i]);
        if (value == -1 && PyErr_Occurred()) {
            Py_DECREF(sequence);
            return NULL;
        }
        w->data[w->len + i] = value;
    }
    w->len += n;
    Py_DECREF(sequence);
    Py_RETURN_NONE;
}

/* words.take(): the words so far, as a list of ints; the log is empty after. */
static PyObject *
Words_take(Words *w, PyObject *unused)
{
    PyObject *out = PyList_New(w->len);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < w->len; i++) {
        PyObject *value = PyLong_FromLongLong(w->data[i]);
        if (value == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, value);
    }
    w->len = 0;
    if (w->cap > (1 << 20)) {  /* a burst's buffer is not kept */
        PyMem_Free(w->data);
        w->data = NULL;
        w->cap = 0;
    }
    return out;
}

static Py_ssize_t
Words_length(Words *w)
{
    return w->len;
}

static void
Words_dealloc(Words *w)
{
    PyMem_Free(w->data);
    Py_TYPE(w)->tp_free((PyObject *)w);
}

static PyMethodDef Words_methods[] = {
    {"extend", (PyCFunction)Words_extend, METH_O, "Append the ints of a record."},
    {"take", (PyCFunction)Words_take, METH_NOARGS, "Remove and return every word, as a list of ints."},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods Words_sequence = {.sq_length = (lenfunc)Words_length};

static PyTypeObject WordsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "stepscope_torch._fastpath.Words",
    .tp_doc = "The words of a flat phase log as int64s (stepscope.capture.phases.Words, compiled).",
    .tp_basicsize = sizeof(Words),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_dealloc = (destructor)Words_dealloc,
    .tp_methods = Words_methods,
    .tp_as_sequence = &Words_sequence,
};

/* An exception is set: what `failsafe.fail(exc)` does with one (log it, record the status,
   turn that side off), so that nothing escapes into training. -1 where it is not an
   Exception (KeyboardInterrupt): that one goes on. */
static COLD int
hand_to(PyObject *failsafe)
{
    if (!PyErr_ExceptionMatches(PyExc_Exception))
        return -1;
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    PyErr_NormalizeException(&type, &value, &traceback);
    if (traceback != NULL && value != NULL)
        PyException_SetTraceback(value, traceback);
    PyObject *done = value != NULL ? PyObject_CallMethodOneArg(failsafe, str_fail, value) : NULL;
    if (done == NULL)
        PyErr_WriteUnraisable(failsafe);
    Py_XDECREF(done);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(traceback);
    return 0;
}

/* HookBase._timeline_failed: the clock or the log failed (an exception is set): the
   timeline stops and the profiler side turns off; tensors go on. 0, or -1 to raise. */
static COLD int
timeline_failed(Counters *c)
{
    c->timing = 0;
    Py_INCREF(Py_None);
    replace(&c->now, Py_None);
    c->clock_is_perf_counter = 0;
    return hand_to(c->profiler_failsafe);
}

/* ---- the phase log, from the hot path ----------------------------------------------- */

/* The log takes raw words: its words are a Words and the clock is perf_counter_ns (which is
   CLOCK_MONOTONIC in CPython on Linux): a record is a few int64 stores, no object. */
static inline int
raw_log(Counters *c)
{
#ifdef __linux__
    return c->words != NULL && c->clock_is_perf_counter;
#else
    return 0;
#endif
}

/* Append a record (the objects `words`) to the phase log, as log_append(record) does. */
static int
append_record(Counters *c, PyObject *const *words, Py_ssize_t n)
{
    PyObject *record = PyTuple_New(n);
    if (record == NULL)
        return -1;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_INCREF(words[i]);
        PyTuple_SET_ITEM(record, i, words[i]);
    }
    PyObject *done = PyObject_CallOneArg(c->log_append, record);
    Py_DECREF(record);
    Py_XDECREF(done);
    return done == NULL ? -1 : 0;
}

/* last_end as an object (a new reference). */
static PyObject *
last_end(Counters *c)
{
    if (c->last_end_is_ns)
        return PyLong_FromLongLong(c->last_end_ns);
    Py_INCREF(c->last_end);
    return c->last_end;
}

static inline void
set_last_end_ns(Counters *c, long long ns)
{
    c->last_end_ns = ns;
    c->last_end_is_ns = 1;
}

/* (code, now()) to the log; with `ends`, the reading is the step's end (last_end). */
static int
log_event(Counters *c, int code, int ends)
{
    if (raw_log(c)) {
        long long record[2] = {c->code_values[code], monotonic_ns()};
        if (words_push((Words *)c->words, record, 2) < 0)
            return -1;
        if (ends)
            set_last_end_ns(c, record[1]);
        return 0;
    }
    PyObject *reading = PyObject_CallNoArgs(c->now);
    if (reading == NULL)
        return -1;
    PyObject *words[2] = {c->codes[code], reading};
    if (append_record(c, words, 2) < 0) {
        Py_DECREF(reading);
        return -1;
    }
    if (ends) {
        replace(&c->last_end, reading);
        c->last_end_is_ns = 0;
    }
    else {
        Py_DECREF(reading);
    }
    return 0;
}

/* HookBase.finish_step_timing(): the open step's timeline ends now. 0, or -1 to raise. */
static int
finish_step_timing(Counters *c)
{
    if (!c->timing)
        return 0;
    if (log_event(c, CODE_STEP_END, 1) < 0)
        return timeline_failed(c);
    c->timing = 0;
    return 0;
}

/* ---- scalar steps ---------------------------------------------------------------------

   Under the capture defaults the losses (and metrics) are due at every step. Once Python
   armed a run of such steps (Hook._compile_scalar_steps: the hook's set-up leaves nothing
   else to do at them), this path runs them too: a step here is a real StepState, so any
   Python code that saves into the open step (save_scalar, a plugin) works as usual; the
   registered loss modules' outputs are read here (`record_loss`); an ended step goes to
   `held`, a list HeldSteps takes (take_held) and holds as it holds the steps the Python
   path hands over. Whatever else happens at such a step (a loss read otherwise, a value a
   held step may not hold, a stop decision) hands it to Python first (`promote`), which
   goes on with it as if it had opened it. */

static inline int
scalar_open(Counters *c)
{
    return c->scalar_step != NULL && c->step == c->scalar_step;
}

/* Python takes over the open scalar step: Hook._adopt_step(loss_armed), after which its
   loss modules save as they did here. 0, or -1 to raise. */
static COLD int
promote(Counters *c)
{
    int armed = c->loss_armed;
    Py_CLEAR(c->scalar_step);
    Py_CLEAR(c->scalar_tensors);
    Py_CLEAR(c->scalar_shapes);
    c->loss_armed = 0;
    if (c->adopt == NULL)
        return 0;
    PyObject *done = PyObject_CallOneArg(c->adopt, armed ? Py_True : Py_False);
    if (done == NULL)
        return hand_to(c->failsafe);
    Py_DECREF(done);
    return 0;
}

/* The bytes of `value` when a held step may hold it (a numpy scalar of a plain dtype, a
   numpy array: what save_scalar and a functional loss's save_loss record), else -1. */
static Py_ssize_t
held_bytes(Counters *c, PyObject *value)
{
    PyObject *type = (PyObject *)Py_TYPE(value);
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(c->held_types); i++)
        if (PyTuple_GET_ITEM(c->held_types, i) == type)
            return 8;
    if (type != c->array_type)
        return -1;
    PyObject *nbytes = PyObject_GetAttrString(value, "nbytes");
    Py_ssize_t n = nbytes != NULL ? PyLong_AsSsize_t(nbytes) : -1;
    Py_XDECREF(nbytes);
    PyErr_Clear();
    return n;
}

/* Whether the open scalar step can end here: its due collections are still the run's (no
   make_due) and it holds a few values that a held step holds (HeldSteps.hand_over would
   hold it too). 1 or 0 (an error reads as 0: Python ends it). */
static int
scalar_step_holdable(Counters *c)
{
    PyObject *names = PyObject_GetAttr(c->scalar_step, str_due_names);
    PyObject *tensors = PyObject_GetAttr(c->scalar_step, str_tensors);
    PyObject *shapes = PyObject_GetAttr(c->scalar_step, str_shapes);
    int holdable = names == c->scalar_names && tensors == c->scalar_tensors && shapes == c->scalar_shapes
        && PyDict_GET_SIZE(tensors) <= c->max_values && PyDict_GET_SIZE(shapes) <= c->max_values;
    Py_XDECREF(names);
    Py_XDECREF(tensors);
    Py_XDECREF(shapes);
    PyErr_Clear();
    Py_ssize_t position = 0, total = 0, n;
    PyObject *key, *value;
    while (holdable && PyDict_Next(c->scalar_tensors, &position, &key, &value))
        holdable = (n = held_bytes(c, value)) >= 0 && (total += n) <= c->max_bytes;
    return holdable;
}

/* A scalar step of the armed run (not yet open: nothing changed), or NULL with no
   exception set when it cannot be made here. */
static PyObject *
new_scalar_step(Counters *c, long long global_step, long long mode_step)
{
    PyObject *numbers[2] = {PyLong_FromLongLong(global_step), PyLong_FromLongLong(mode_step)};
    PyObject *step = NULL;
    if (numbers[0] != NULL && numbers[1] != NULL) {
        PyObject *args[5] = {numbers[0], c->scalar_mode, numbers[1], c->scalar_due, c->scalar_names};
        step = PyObject_Vectorcall(c->step_type, args, 5, NULL);
    }
    Py_XDECREF(numbers[0]);
    Py_XDECREF(numbers[1]);
    if (step == NULL)
        PyErr_Clear();
    return step;
}

/* The scalar step `step` (a new reference, taken) is the open step from now on. */
static int
open_scalar_step(Counters *c, PyObject *step, int m, long long global_step, long long mode_step)
{
    PyObject *tensors = PyObject_GetAttr(step, str_tensors);
    PyObject *shapes = tensors != NULL ? PyObject_GetAttr(step, str_shapes) : NULL;
    if (shapes == NULL || !PyDict_CheckExact(tensors) || !PyDict_CheckExact(shapes)) {
        Py_XDECREF(tensors);
        Py_XDECREF(shapes);
        Py_DECREF(step);
        PyErr_Clear();
        return -1;
    }
    Py_INCREF(step);
    replace(&c->step, step);
    replace(&c->scalar_step, step);
    replace(&c->scalar_tensors, tensors);
    replace(&c->scalar_shapes, shapes);
    c->scalar_global_step = global_step;
    c->scalar_mode_step = mode_step;
    c->loss_armed = 1;  /* (Hook._on_step_begin: the loss modules save until the update) */
    c->next_due[m] = mode_step + 1;  /* (StepDriver._due_at, in a run) */
    c->scalar_steps++;
    return 0;
}

/* The open scalar step ended (its timeline already): to `held` when it saved anything,
   and the held steps to the writer once hold_steps wait or the first waited hold_ns
   (HeldSteps.hand_over). 0, or -1 to raise. */
static int
hold_scalar_step(Counters *c)
{
    PyObject *step = c->scalar_step, *tensors = c->scalar_tensors, *shapes = c->scalar_shapes;
    c->scalar_step = c->scalar_tensors = c->scalar_shapes = NULL;
    c->loss_armed = 0;
    int failed = 0, due = 0;
    if (PyDict_GET_SIZE(tensors) || PyDict_GET_SIZE(shapes)) {
        PyObject *record = Py_BuildValue("(LOLOO)", c->scalar_global_step, c->scalar_mode, c->scalar_mode_step, tensors, shapes);
        failed = record == NULL || PyList_Append(c->held, record) < 0;
        Py_XDECREF(record);
        long long now = monotonic_ns();
        if (!failed && PyList_GET_SIZE(c->held) == 1)
            c->held_first_ns = now;
        due = !failed && (PyList_GET_SIZE(c->held) >= c->hold_steps || now - c->held_first_ns >= c->hold_ns);
    }
    Py_DECREF(step);
    Py_DECREF(tensors);
    Py_DECREF(shapes);
    if (due) {
        PyObject *done = PyObject_CallNoArgs(c->release);
        failed = done == NULL;
        Py_XDECREF(done);
    }
    return failed ? hand_to(c->failsafe) : 0;
}

/* ModelTensors._record_scalar for a registered loss module's output, into the open scalar
   step: a 0-d CPU tensor of a plain dtype, read with .item(). DONE, HANDED_OVER (another
   value: Python saves it), or -1 with an exception set. */
static int record_loss(Counters *c, PyObject *forward, PyObject *output);

/* The length of the one registered optimizer's state (the number of parameters that have
   state), or -1 with an exception set. */
static Py_ssize_t
optimizer_states(PyObject *optimizer)
{
    PyObject *state = PyObject_GetAttr(optimizer, str_state);
    if (state == NULL)
        return -1;
    Py_ssize_t n = PyObject_Length(state);
    Py_DECREF(state);
    return n;
}

/* ---- the routine cases (mirrors of Hook._forward_begins & co. in hook.py) ------------ */

#define HANDED_OVER 0  /* not the routine case: nothing was changed, the Python method runs */
#define DONE 1

/* Hook._forward_begins(module). On DONE, *wanted: the forward's end is wanted. */
static int
forward_begins(Counters *c, PyObject *module, int plain_getattr, int *wanted)
{
    PyObject *mode = c->explicit_mode;
    if (mode == Py_None) {
        PyObject *training = plain_getattr ? PyObject_GenericGetAttr(module, str_training) : PyObject_GetAttr(module, str_training);
        if (training == NULL) {
            PyErr_Clear();
            return HANDED_OVER;
        }
        mode = training == Py_True ? c->train : training == Py_False ? c->eval : NULL;
        Py_DECREF(training);
        if (mode == NULL)
            return HANDED_OVER;
        if (mode == c->train) {
            /* A forward without autograd (torch.no_grad, inference_mode) in training mode:
               Python decides whether it is a step (hook.py, _forward_begins). */
            PyObject *enabled = PyObject_CallNoArgs(is_grad_enabled);
            if (enabled == NULL) {
                PyErr_Clear();
                return HANDED_OVER;
            }
            Py_DECREF(enabled);
            if (enabled != Py_True)
                return HANDED_OVER;
        }
    }
    PyObject *step = c->step;
    if (mode == c->train && c->drives_optimizer) {
        if ((step == c->idle || scalar_open(c)) && c->global_step - 1 == c->train_at) {
            /* Another micro-batch of the step that ends at optimizer.step(). */
            if (c->timing && failsafe_enabled(c, c->failsafe) && log_event(c, CODE_FORWARD_BEGIN, 0) < 0 && timeline_failed(c) < 0)
                return -1;
            *wanted = c->timing;
            return DONE;
        }
    }
    else if (!c->drives_optimizer && step != Py_None && (c->mode == c->train || (step != c->idle && !scalar_open(c)))) {
        /* Without a registered optimizer, a TRAIN step ends at the next forward: end_step()
           of a step where nothing was due, or of a scalar step, unless a stop decision is
           due with it. */
        int scalar = scalar_open(c);
        if ((step != c->idle && !scalar) || c->closed || !failsafe_enabled(c, c->failsafe) || c->detailed != Py_None || c->notify
                || c->train_ends + 1 >= c->stop_check_at || (scalar && !scalar_step_holdable(c)))
            return HANDED_OVER;
        if (finish_step_timing(c) < 0 || (scalar && hold_scalar_step(c) < 0))
            return -1;
        Py_INCREF(Py_None);
        replace(&c->step, Py_None);
        c->train_ends++;
        step = Py_None;
    }
    /* HookBase._open_step(mode, FORWARD_BEGIN): a step where nothing is due or a scalar
       step of the armed run, after one of either. */
    int m = mode_index(c, mode);
    long long global_step = c->global_step, mode_step = m > 0 ? c->begun[m] : 0;
    int timed = global_step >= c->meter_at;  /* the cost meter times this one (a block begins) */
    int due = m > 0 && c->next_due[m] != NONE_DUE && mode_step >= c->next_due[m];
    int scalar = due && m == c->scalar_m && mode_step >= c->scalar_first && mode_step < c->scalar_until;
    int previous_scalar = step != Py_None && scalar_open(c);
    if (m < 0 || c->closed || !failsafe_enabled(c, c->failsafe) || (step != Py_None && step != c->idle && !previous_scalar)
            || c->notify || c->detailed != Py_None || (timed && c->meter_block == NULL) || (due && !scalar)
            || (previous_scalar && !scalar_step_holdable(c)))
        return HANDED_OVER;
    PyObject *opened = scalar ? new_scalar_step(c, global_step, mode_step) : NULL;
    if (scalar && opened == NULL)
        return HANDED_OVER;
    double started = 0;
    if (timed) {
        PyObject *reading = PyObject_CallNoArgs(perf_counter);
        started = reading != NULL ? PyFloat_AsDouble(reading) : -1;
        Py_XDECREF(reading);
        if (started == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            Py_XDECREF(opened);
            return HANDED_OVER;
        }
    }
    /* The clock first (the step begins now), then the previous step's end. */
    int timeline = c->now != Py_None, raw = timeline && raw_log(c);
    long long now_ns = raw ? monotonic_ns() : 0;
    PyObject *now = NULL;
    if (timeline && !raw && (now = PyObject_CallNoArgs(c->now)) == NULL) {
        timeline = 0;
        if (timeline_failed(c) < 0) {
            Py_XDECREF(opened);
            return -1;
        }
    }
    if (step != Py_None && (finish_step_timing(c) < 0 || (previous_scalar && hold_scalar_step(c) < 0))) {
        Py_XDECREF(now);
        Py_XDECREF(opened);
        return -1;
    }
    if (mode != c->mode) {
        Py_INCREF(mode);
        replace(&c->mode, mode);
    }
    c->begun[m] = mode_step + 1;
    c->global_step = global_step + 1;
    if (opened != NULL) {
        if (open_scalar_step(c, opened, m, global_step, mode_step) < 0) {
            /* (Not a StepState of dicts: cannot happen with stepscope's own.) The step is
               numbered; it saves nothing. */
            Py_INCREF(c->idle);
            replace(&c->step, c->idle);
        }
    }
    else if (step != c->idle) {
        Py_INCREF(c->idle);
        replace(&c->step, c->idle);
    }
    if (timeline && failsafe_enabled(c, c->profiler_failsafe)) {
        /* (BEGIN_EVENT, step, mode, begin, FORWARD_BEGIN, now): the step's time starts where
           the previous one's work ended; the wait in between is its "data" phase. */
        int appended;
        if (raw) {
            long long begin = c->last_end_is_ns ? c->last_end_ns : c->last_end == Py_None ? now_ns : PyLong_AsLongLong(c->last_end);
            long long record[6] = {c->code_values[CODE_BEGIN_EVENT], global_step, m, begin, c->code_values[CODE_FORWARD_BEGIN], now_ns};
            appended = begin == -1 && PyErr_Occurred() ? -1 : words_push((Words *)c->words, record, 6);
        }
        else {
            PyObject *begin = last_end(c);
            PyObject *number = PyLong_FromLongLong(global_step);
            PyObject *words[6] = {c->codes[CODE_BEGIN_EVENT], number, mode, begin == Py_None ? now : begin, c->codes[CODE_FORWARD_BEGIN], now};
            appended = number != NULL && begin != NULL ? append_record(c, words, 6) : -1;
            Py_XDECREF(number);
            Py_XDECREF(begin);
        }
        if (appended == 0)
            c->timing = 1;
        else if (timeline_failed(c) < 0) {
            Py_XDECREF(now);
            return -1;
        }
    }
    Py_XDECREF(now);
    if (mode == c->train)
        c->train_at = global_step;
    *wanted = c->timing;
    if (timed) {
        PyObject *reading = PyObject_CallNoArgs(perf_counter);
        double elapsed = reading != NULL ? PyFloat_AsDouble(reading) - started : 0;
        Py_XDECREF(reading);
        PyObject *done = reading != NULL ? PyObject_CallFunction(c->meter_block, "Lddi", global_step, started, elapsed, 1) : NULL;
        Py_XDECREF(done);
        if (done == NULL && hand_to(c->failsafe) < 0)
            return -1;
    }
    return DONE;
}

/* Hook._forward_ends(module, args, output), at a step where nothing is due. */
static int
forward_ends(Counters *c)
{
    if (c->step == Py_None)
        return DONE;
    if (c->step != c->idle && !scalar_open(c))
        return HANDED_OVER;
    if (c->mode != c->train)
        return finish_step_timing(c) < 0 ? -1 : DONE;  /* an evaluation step is its forward */
    if (c->timing && log_event(c, CODE_FORWARD_END, 0) < 0 && timeline_failed(c) < 0)
        return -1;
    return DONE;
}

/* Hook._on_optimizer_pre: the update of the open TRAIN step begins. */
static int
optimizer_begins(Counters *c)
{
    if (!failsafe_enabled(c, c->failsafe))
        return DONE;  /* (as the Python method) */
    if ((c->step != c->idle && !scalar_open(c)) || c->global_step - 1 != c->train_at)
        return HANDED_OVER;  /* a step that saves, or optimizer.step() without a forward */
    if (c->timing && log_event(c, CODE_OPTIMIZER_BEGIN, 0) < 0 && timeline_failed(c) < 0)
        return -1;
    return DONE;
}

/* Hook._on_optimizer_post: the TRAIN step ends (counted for the ranks' stop agreement). */
static int
optimizer_ends(Counters *c)
{
    long long ended = c->train_ends + 1;
    int live = c->step != Py_None && failsafe_enabled(c, c->failsafe);
    int scalar = live && scalar_open(c);
    if (ended >= c->stop_check_at || (live && c->step != c->idle && !scalar))
        return HANDED_OVER;  /* a stop decision, or a step that saves */
    if (scalar && c->optimizer != NULL) {
        /* Hook._states_hold_no_scalars: known for this many parameters with state. */
        Py_ssize_t states = optimizer_states(c->optimizer);
        if (states != c->optimizer_states) {
            PyErr_Clear();
            return HANDED_OVER;
        }
    }
    c->train_ends = ended;
    c->train_at = -1;
    if (live && finish_step_timing(c) < 0)
        return -1;
    if (scalar)
        c->loss_armed = 0;  /* (ModelTensors._forward_work_ends: a loss after the update is no step's) */
    return DONE;
}

/* ---- Counters: the Python face -------------------------------------------------------- */

static PyObject *
hand_over(Counters *c, PyObject *slow, PyObject *const *args, Py_ssize_t nargs)
{
    if (slow == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "stepscope: compiled counters used before attach()");
        return NULL;
    }
    if (scalar_open(c) && promote(c) < 0)  /* Python goes on with the open scalar step */
        return NULL;
    c->handed_over++;
    return PyObject_Vectorcall(slow, args, nargs, NULL);
}

/* What an optimizer hook returns: None where the step was routine, else the slow path's
   answer (or NULL on an error). */
static PyObject *
routine_or_hand_over(Counters *c, int outcome, PyObject *slow, PyObject *const *args, Py_ssize_t nargs)
{
    if (outcome < 0)
        return NULL;
    if (outcome == HANDED_OVER)
        return hand_over(c, slow, args, nargs);
    c->routine++;
    Py_RETURN_NONE;
}

static PyObject *
Counters_optimizer_pre(Counters *c, PyObject *const *args, Py_ssize_t nargs)
{
    return routine_or_hand_over(c, optimizer_begins(c), c->slow_pre, args, nargs);
}

static PyObject *
Counters_optimizer_post(Counters *c, PyObject *const *args, Py_ssize_t nargs)
{
    return routine_or_hand_over(c, optimizer_ends(c), c->slow_post, args, nargs);
}

static PyObject *
Counters_attach(Counters *c, PyObject *args)
{
    PyObject *begin, *end, *pre, *post, *meter_block;
    if (!PyArg_ParseTuple(args, "OOOOO:attach", &begin, &end, &pre, &post, &meter_block))
        return NULL;
    PyObject **fields[] = {&c->slow_begin, &c->slow_end, &c->slow_pre, &c->slow_post, &c->meter_block};
    PyObject *values[] = {begin, end, pre, post, meter_block};
    for (int i = 0; i < 5; i++) {
        Py_INCREF(values[i]);
        replace(fields[i], values[i]);
    }
    Py_RETURN_NONE;
}

static PyObject *Counters_forward(Counters *c, PyObject *args);
static PyObject *Counters_loss_forward(Counters *c, PyObject *args);

/* setup_scalar_steps(step_type, adopt, plain_scalars, strided, held_types, array_type,
   max_values, max_bytes): what scalar steps are made of, given once. */
static PyObject *
Counters_setup_scalar_steps(Counters *c, PyObject *args)
{
    PyObject *step_type, *adopt, *plain_scalars, *strided, *held_types, *array_type;
    Py_ssize_t max_values, max_bytes;
    if (!PyArg_ParseTuple(args, "O!OO!OO!O!nn:setup_scalar_steps", &PyType_Type, &step_type, &adopt, &PyDict_Type, &plain_scalars,
                          &strided, &PyTuple_Type, &held_types, &PyType_Type, &array_type, &max_values, &max_bytes))
        return NULL;
    if (!PyCallable_Check(adopt)) {
        PyErr_SetString(PyExc_TypeError, "setup_scalar_steps: adopt must be callable");
        return NULL;
    }
    PyObject **fields[] = {&c->step_type, &c->adopt, &c->plain_scalars, &c->strided, &c->held_types, &c->array_type};
    PyObject *values[] = {step_type, adopt, plain_scalars, strided, held_types, array_type};
    for (int i = 0; i < 6; i++) {
        Py_INCREF(values[i]);
        replace(fields[i], values[i]);
    }
    c->max_values = max_values;
    c->max_bytes = max_bytes;
    Py_RETURN_NONE;
}

/* arm_scalar_run(step, first, until, optimizer, release, hold_steps, hold_s): the open step
   `step` (a scalar step Python opened) and the steps of its mode numbered [first, until)
   (`until` an int or inf) run here; `optimizer`: the one registered optimizer or None;
   `release()` hands the held steps to the writer. */
static PyObject *
Counters_arm_scalar_run(Counters *c, PyObject *args)
{
    PyObject *step, *until, *optimizer, *release;
    long long first;
    Py_ssize_t hold_steps;
    double hold_s;
    if (!PyArg_ParseTuple(args, "OLOOOnd:arm_scalar_run", &step, &first, &until, &optimizer, &release, &hold_steps, &hold_s))
        return NULL;
    if (c->step_type == NULL || step != c->step || !PyObject_TypeCheck(step, (PyTypeObject *)c->step_type)) {
        PyErr_SetString(PyExc_ValueError, "arm_scalar_run: the open StepState must be given, after setup_scalar_steps");
        return NULL;
    }
    if (!PyCallable_Check(release) || hold_steps < 1) {
        PyErr_SetString(PyExc_ValueError, "arm_scalar_run: release must be callable and hold_steps positive");
        return NULL;
    }
    long long until_step = LLONG_MAX;
    if (PyLong_Check(until)) {
        until_step = PyLong_AsLongLong(until);
        if (until_step == -1 && PyErr_Occurred())
            return NULL;
    }
    else if (!PyFloat_Check(until) || PyFloat_AS_DOUBLE(until) != Py_HUGE_VAL) {
        PyErr_SetString(PyExc_TypeError, "arm_scalar_run: until must be an int or inf");
        return NULL;
    }
    Py_ssize_t states = optimizer != Py_None ? optimizer_states(optimizer) : 0;
    if (states < 0)
        return NULL;
    PyObject *attributes[] = {PyObject_GetAttrString(step, "mode"), PyObject_GetAttrString(step, "due"),
                              PyObject_GetAttrString(step, "due_names"), PyObject_GetAttrString(step, "global_step"),
                              PyObject_GetAttrString(step, "mode_step"), PyObject_GetAttr(step, str_tensors),
                              PyObject_GetAttr(step, str_shapes)};
    int n = sizeof(attributes) / sizeof(attributes[0]), ok = 1;
    for (int i = 0; i < n; i++)
        ok = ok && attributes[i] != NULL;
    int m = ok ? mode_index(c, attributes[0]) : -1;
    long long global_step = ok ? PyLong_AsLongLong(attributes[3]) : -1, mode_step = ok ? PyLong_AsLongLong(attributes[4]) : -1;
    if (ok && (m < 1 || PyErr_Occurred() || !PyDict_CheckExact(attributes[5]) || !PyDict_CheckExact(attributes[6]))) {
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "arm_scalar_run: a step of a known mode, with dicts, must be given");
        ok = 0;
    }
    if (!ok) {
        for (int i = 0; i < n; i++)
            Py_XDECREF(attributes[i]);
        return NULL;
    }
    replace(&c->scalar_mode, attributes[0]);
    replace(&c->scalar_due, attributes[1]);
    replace(&c->scalar_names, attributes[2]);
    Py_DECREF(attributes[3]);
    Py_DECREF(attributes[4]);
    replace(&c->scalar_tensors, attributes[5]);
    replace(&c->scalar_shapes, attributes[6]);
    Py_INCREF(step);
    replace(&c->scalar_step, step);
    c->scalar_global_step = global_step;
    c->scalar_mode_step = mode_step;
    c->loss_armed = 1;
    c->scalar_m = m;
    c->scalar_first = first;
    c->scalar_until = until_step;
    replace(&c->optimizer, optimizer != Py_None ? Py_NewRef(optimizer) : NULL);
    c->optimizer_states = states;
    Py_INCREF(release);
    replace(&c->release, release);
    c->hold_steps = hold_steps;
    c->hold_ns = (long long)(hold_s * 1e9);
    Py_RETURN_NONE;
}

/* disarm_scalar_run(): no step runs here as a scalar step from now on; an open one goes
   to Python. */
static PyObject *
Counters_disarm_scalar_run(Counters *c, PyObject *unused)
{
    c->scalar_m = 0;
    if (scalar_open(c) && promote(c) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* take_held(): the scalar steps ended here since the last take, oldest first. */
static PyObject *
Counters_take_held(Counters *c, PyObject *unused)
{
    PyObject *fresh = PyList_New(0);
    if (fresh == NULL)
        return NULL;
    PyObject *held = c->held;
    c->held = fresh;
    return held;
}

/* held_age(): seconds since the oldest step take_held would return ended, or None. */
static PyObject *
Counters_held_age(Counters *c, PyObject *unused)
{
    if (PyList_GET_SIZE(c->held) == 0)
        Py_RETURN_NONE;
    return PyFloat_FromDouble((double)(monotonic_ns() - c->held_first_ns) / 1e9);
}

static PyObject *
Counters_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *keywords[] = {"failsafe", "profiler_failsafe", "notify", "train", "eval", "codes", NULL};
    PyObject *failsafe, *profiler_failsafe, *train, *eval, *codes;
    int notify;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOpOOO!:Counters", keywords, &failsafe, &profiler_failsafe, &notify, &train,
                                     &eval, &PyDict_Type, &codes))
        return NULL;
    if (Py_TYPE(failsafe) != Py_TYPE(profiler_failsafe)) {
        PyErr_SetString(PyExc_TypeError, "Counters: the two fail-safes must be of one type");
        return NULL;
    }
    /* FailSafe.enabled is read at its __slots__ offset. */
    PyObject *descr = PyObject_GetAttrString((PyObject *)Py_TYPE(failsafe), "enabled");
    if (descr == NULL)
        return NULL;
    Py_ssize_t offset = -1;
    if (Py_IS_TYPE(descr, &PyMemberDescr_Type) && ((PyMemberDescrObject *)descr)->d_member->type == Py_T_OBJECT_EX)
        offset = ((PyMemberDescrObject *)descr)->d_member->offset;
    Py_DECREF(descr);
    if (offset < 0) {
        PyErr_Format(PyExc_TypeError, "Counters: %s.enabled is not a __slots__ member", Py_TYPE(failsafe)->tp_name);
        return NULL;
    }
    Counters *c = (Counters *)type->tp_alloc(type, 0);
    if (c == NULL)
        return NULL;
    c->enabled_offset = offset;
    Py_INCREF(Py_TYPE(failsafe));
    c->failsafe_type = Py_TYPE(failsafe);
    PyObject **objects[] = {&c->step, &c->idle, &c->explicit_mode, &c->last_end, &c->detailed, &c->now, &c->log_append};
    for (size_t i = 0; i < sizeof(objects) / sizeof(objects[0]); i++) {
        Py_INCREF(Py_None);
        *objects[i] = Py_None;
    }
    PyObject **given[] = {&c->failsafe, &c->profiler_failsafe, &c->train, &c->eval, &c->mode};
    PyObject *values[] = {failsafe, profiler_failsafe, train, eval, train};
    for (size_t i = 0; i < sizeof(given) / sizeof(given[0]); i++) {
        Py_INCREF(values[i]);
        *given[i] = values[i];
    }
    for (int i = 0; i < CODES; i++) {
        PyObject *code = PyDict_GetItemString(codes, code_names[i]);
        if (code == NULL || !PyLong_CheckExact(code)) {
            PyErr_Format(PyExc_TypeError, "Counters: codes['%s'] must be an int", code_names[i]);
            Py_DECREF(c);
            return NULL;
        }
        Py_INCREF(code);
        c->codes[i] = code;
        c->code_values[i] = PyLong_AsLongLong(code);
    }
    c->notify = (char)notify;
    c->held = PyList_New(0);
    if (c->held == NULL) {
        Py_DECREF(c);
        return NULL;
    }
    c->stop_check_at = 1;
    c->meter_at = 1LL << 62;  /* NEVER (stepscope.capture.step_counters) */
    c->train_at = -1;
    for (int i = 0; i < MODES; i++)
        c->begun[i] = c->next_due[i] = 0;
    /* The per-mode tables, as Python sees them. */
    for (int table = 0; table < 2; table++) {
        ModeTable *view = (ModeTable *)ModeTableType.tp_alloc(&ModeTableType, 0);
        if (view == NULL) {
            Py_DECREF(c);
            return NULL;
        }
        Py_INCREF(c);
        view->owner = c;
        view->values = table == 0 ? c->begun : c->next_due;
        *(table == 0 ? &c->begun_table : &c->next_due_table) = (PyObject *)view;
    }
    return (PyObject *)c;
}

/* Each type's object fields, listed once for its traverse and clear (X-macros).
   Counters' GC fields can lead back to the hook (a cycle); its plain fields hold strings,
   ints, the Words buffer and the failsafe's exception type, cleared but not visited. */
#define VISIT_FIELD(name) Py_VISIT(self->name);
#define CLEAR_FIELD(name) Py_CLEAR(self->name);
#define COUNTERS_GC_FIELDS(X) X(step) X(idle) X(last_end) X(failsafe) X(profiler_failsafe) X(detailed) X(now) \
    X(log_append) X(begun_table) X(next_due_table) X(slow_begin) X(slow_end) X(slow_pre) X(slow_post) X(meter_block) \
    X(scalar_step) X(scalar_tensors) X(scalar_shapes) X(scalar_mode) X(scalar_due) X(scalar_names) X(optimizer) X(held) \
    X(release) X(step_type) X(adopt) X(plain_scalars) X(strided) X(held_types) X(array_type)
#define COUNTERS_PLAIN_FIELDS(X) X(mode) X(explicit_mode) X(words) X(train) X(eval) X(failsafe_type)
#define DRIVEN_FORWARD_FIELDS(X) X(counters) X(model) X(original) X(dict) X(bound) X(before) X(after) X(name)
#define BOUND_FORWARD_FIELDS(X) X(forward) X(instance)

static int
Counters_traverse(Counters *self, visitproc visit, void *arg)
{
    COUNTERS_GC_FIELDS(VISIT_FIELD)
    return 0;
}

static int
Counters_clear(Counters *self)
{
    COUNTERS_GC_FIELDS(CLEAR_FIELD)
    COUNTERS_PLAIN_FIELDS(CLEAR_FIELD)
    for (int i = 0; i < CODES; i++)
        Py_CLEAR(self->codes[i]);
    return 0;
}

static void
Counters_dealloc(Counters *c)
{
    PyObject_GC_UnTrack(c);
    Counters_clear(c);
    Py_TYPE(c)->tp_free((PyObject *)c);
}

/* `now` and `log_append` are set through these: they note what the hot path may do
   directly (read the clock, append to the list). */
static int
callable_or_none(PyObject *value, const char *name)
{
    if (value == NULL || (value != Py_None && !PyCallable_Check(value))) {
        PyErr_Format(PyExc_TypeError, "%s must be a callable or None", name);
        return -1;
    }
    return 0;
}

static PyObject *
Counters_get_now(Counters *c, void *closure)
{
    return Py_NewRef(c->now);
}

static int
Counters_set_now(Counters *c, PyObject *value, void *closure)
{
    if (callable_or_none(value, "now") < 0)
        return -1;
    Py_INCREF(value);
    replace(&c->now, value);
    c->clock_is_perf_counter = value == perf_counter_ns;
    return 0;
}

static PyObject *
Counters_get_log_append(Counters *c, void *closure)
{
    return Py_NewRef(c->log_append);
}

static int
Counters_set_log_append(Counters *c, PyObject *value, void *closure)
{
    if (callable_or_none(value, "log_append") < 0)
        return -1;
    PyObject *words = NULL;  /* a Words' own extend: the hot path stores the words itself */
    if (PyCFunction_Check(value) && PyCFunction_GET_FUNCTION(value) == (PyCFunction)Words_extend
            && PyCFunction_GET_SELF(value) != NULL && Py_IS_TYPE(PyCFunction_GET_SELF(value), &WordsType)) {
        words = PyCFunction_GET_SELF(value);
        Py_INCREF(words);
    }
    replace(&c->words, words);
    Py_INCREF(value);
    replace(&c->log_append, value);
    return 0;
}

static PyObject *
Counters_get_last_end(Counters *c, void *closure)
{
    return last_end(c);
}

static int
Counters_set_last_end(Counters *c, PyObject *value, void *closure)
{
    if (value == NULL) {
        PyErr_SetString(PyExc_TypeError, "last_end cannot be deleted");
        return -1;
    }
    Py_INCREF(value);
    replace(&c->last_end, value);
    c->last_end_is_ns = 0;
    return 0;
}

static PyObject *
Counters_log_words(Counters *c, PyObject *unused)
{
    return PyType_GenericNew(&WordsType, NULL, NULL);
}

static PyGetSetDef Counters_getset[] = {
    {"last_end", (getter)Counters_get_last_end, (setter)Counters_set_last_end, "the clock token at which the last step's work ended", NULL},
    {"now", (getter)Counters_get_now, (setter)Counters_set_now, "the clock's reading function, or None", NULL},
    {"log_append", (getter)Counters_get_log_append, (setter)Counters_set_log_append, "the phase log's append, or None", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

#define MEMBER(name, type, flags, doc) {#name, type, offsetof(Counters, name), flags, doc}
static PyMemberDef Counters_members[] = {
    MEMBER(step, Py_T_OBJECT_EX, 0, "the open step, or None"),
    MEMBER(idle, Py_T_OBJECT_EX, 0, "the open step when nothing is due at it"),
    MEMBER(global_step, Py_T_LONGLONG, 0, "the number the next step gets"),
    MEMBER(mode, Py_T_OBJECT_EX, 0, "the mode of the open or last step"),
    {"begun", Py_T_OBJECT_EX, offsetof(Counters, begun_table), Py_READONLY, "steps begun, per mode"},
    {"next_due", Py_T_OBJECT_EX, offsetof(Counters, next_due_table), Py_READONLY, "the next mode step that may save, per mode (None: never)"},
    MEMBER(closed, Py_T_BOOL, 0, NULL),
    MEMBER(failsafe, Py_T_OBJECT_EX, Py_READONLY, NULL),
    MEMBER(profiler_failsafe, Py_T_OBJECT_EX, Py_READONLY, NULL),
    MEMBER(notify, Py_T_BOOL, 0, NULL),
    MEMBER(detailed, Py_T_OBJECT_EX, 0, NULL),
    MEMBER(meter_at, Py_T_LONGLONG, 0, NULL),
    MEMBER(timing, Py_T_BOOL, 0, NULL),
    MEMBER(train_ends, Py_T_LONGLONG, 0, NULL),
    MEMBER(stop_check_at, Py_T_LONGLONG, 0, NULL),
    MEMBER(explicit_mode, Py_T_OBJECT_EX, 0, NULL),
    MEMBER(drives_optimizer, Py_T_BOOL, 0, NULL),
    MEMBER(train_at, Py_T_LONGLONG, 0, NULL),
    MEMBER(routine, Py_T_ULONGLONG, Py_READONLY, "entry-point calls done here"),
    MEMBER(handed_over, Py_T_ULONGLONG, Py_READONLY, "entry-point calls handed to the hook's Python methods"),
    {"loss_armed", Py_T_BOOL, offsetof(Counters, loss_armed), Py_READONLY, "the open scalar step's losses save"},
    MEMBER(scalar_steps, Py_T_ULONGLONG, Py_READONLY, "steps opened here as scalar steps"),
    {NULL, 0, 0, 0, NULL},
};

static PyMethodDef Counters_methods[] = {
    {"attach", (PyCFunction)Counters_attach, METH_VARARGS,
     "attach(begin, end, pre, post, meter_block): the hook's Python methods for the cases not done here "
     "(Hook._forward_begins, _forward_ends, _on_optimizer_pre, _on_optimizer_post), and for the cost "
     "meter's account at the steps timed here (HookBase._meter_block)."},
    {"forward", (PyCFunction)Counters_forward, METH_VARARGS,
     "forward(model, original): a `forward` for the driven model's class (driver.drive_forward)."},
    {"loss_forward", (PyCFunction)Counters_loss_forward, METH_VARARGS,
     "loss_forward(model, original, before, after): a `forward` for a loss module's driven class (driver.drive_forward)."},
    {"setup_scalar_steps", (PyCFunction)Counters_setup_scalar_steps, METH_VARARGS,
     "setup_scalar_steps(step_type, adopt, plain_scalars, strided, held_types, array_type, max_values, max_bytes): what "
     "scalar steps are made of."},
    {"arm_scalar_run", (PyCFunction)Counters_arm_scalar_run, METH_VARARGS,
     "arm_scalar_run(step, first, until, optimizer, release, hold_steps, hold_s): run the open scalar step and the "
     "run's next ones here."},
    {"disarm_scalar_run", (PyCFunction)Counters_disarm_scalar_run, METH_NOARGS, "Run no scalar step here from now on."},
    {"take_held", (PyCFunction)Counters_take_held, METH_NOARGS, "The scalar steps ended here since the last take."},
    {"held_age", (PyCFunction)Counters_held_age, METH_NOARGS, "Seconds since the oldest held step ended, or None."},
    {"optimizer_pre", (PyCFunction)(void (*)(void))Counters_optimizer_pre, METH_FASTCALL, "a torch optimizer step pre-hook"},
    {"log_words", (PyCFunction)Counters_log_words, METH_NOARGS, "new words for a flat phase log (a Words)"},
    {"optimizer_post", (PyCFunction)(void (*)(void))Counters_optimizer_post, METH_FASTCALL, "a torch optimizer step post-hook"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject CountersType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "stepscope_torch._fastpath.Counters",
    .tp_doc = "Counters(failsafe, profiler_failsafe, notify, train, eval, codes): fastpath.TorchCounters in C, "
              "and the torch entry points of a step.",
    .tp_basicsize = sizeof(Counters),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = Counters_new,
    .tp_traverse = (traverseproc)Counters_traverse,
    .tp_clear = (inquiry)Counters_clear,
    .tp_dealloc = (destructor)Counters_dealloc,
    .tp_methods = Counters_methods,
    .tp_members = Counters_members,
    .tp_getset = Counters_getset,
};

/* ---- ModeTable: counters.begun / counters.next_due, indexed by mode ------------------- */

static Py_ssize_t
ModeTable_length(ModeTable *table)
{
    return MODES;
}

static int
table_index(PyObject *key)
{
    Py_ssize_t index = PyNumber_AsSsize_t(key, PyExc_IndexError);
    if (index == -1 && PyErr_Occurred())
        return -1;
    if (index < 0 || index >= MODES) {
        PyErr_Format(PyExc_IndexError, "mode index %zd out of range", index);
        return -1;
    }
    return (int)index;
}

static PyObject *
ModeTable_get(ModeTable *table, PyObject *key)
{
    int index = table_index(key);
    if (index < 0)
        return NULL;
    long long value = table->values[index];
    if (value == NONE_DUE)
        Py_RETURN_NONE;
    return PyLong_FromLongLong(value);
}

static int
ModeTable_set(ModeTable *table, PyObject *key, PyObject *value)
{
    int index = table_index(key);
    if (index < 0)
        return -1;
    if (value == NULL) {
        PyErr_SetString(PyExc_TypeError, "mode table entries cannot be deleted");
        return -1;
    }
    if (value == Py_None && table->values == table->owner->next_due) {
        table->values[index] = NONE_DUE;
        return 0;
    }
    long long number = PyLong_AsLongLong(value);
    if (number == -1 && PyErr_Occurred())
        return -1;
    if (number == NONE_DUE) {
        PyErr_SetString(PyExc_OverflowError, "step number out of range");
        return -1;
    }
    table->values[index] = number;
    return 0;
}

static int
ModeTable_traverse(ModeTable *table, visitproc visit, void *arg)
{
    Py_VISIT(table->owner);
    return 0;
}

static int
ModeTable_clear(ModeTable *table)
{
    Py_CLEAR(table->owner);
    return 0;
}

static void
ModeTable_dealloc(ModeTable *table)
{
    PyObject_GC_UnTrack(table);
    ModeTable_clear(table);
    Py_TYPE(table)->tp_free((PyObject *)table);
}

static PyMappingMethods ModeTable_mapping = {
    .mp_length = (lenfunc)ModeTable_length,
    .mp_subscript = (binaryfunc)ModeTable_get,
    .mp_ass_subscript = (objobjargproc)ModeTable_set,
};

static PyTypeObject ModeTableType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "stepscope_torch._fastpath.ModeTable",
    .tp_doc = "A per-mode table of the counters, indexed by the mode (ModeKeys).",
    .tp_basicsize = sizeof(ModeTable),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_as_mapping = &ModeTable_mapping,
    .tp_traverse = (traverseproc)ModeTable_traverse,
    .tp_clear = (inquiry)ModeTable_clear,
    .tp_dealloc = (destructor)ModeTable_dealloc,
};

/* ---- DrivenForward: the `forward` of the driven model's class (driver.py) ------------ */

typedef struct {
    PyObject_HEAD
    Counters *counters;
    PyObject *model;     /* only this instance drives steps */
    PyObject *original;  /* the base class's forward */
    PyObject *dict;      /* __wrapped__, __name__, ... (functools.update_wrapper) */
    PyObject *bound;     /* `model.forward`, made once (each step reads it) */
    vectorcallfunc vectorcall;
    /* The model's class reads attributes as object.__getattribute__ does (nn.Module's
       __getattr__ only answers for missing ones, and `training` never is): read
       `training` that way, without looking up __getattribute__ and __getattr__ first. */
    int plain_getattr;
    /* A registered loss module's forward (Counters.loss_forward): `before` and `after` are
       the hook's callbacks (ModelTensors._loss_begins, _loss_ends for this loss), and once
       armed (arm()) a scalar step's output is saved here as `name` (its TensorPlan's). */
    int is_loss, armed, save_raw, save_shape;
    Py_ssize_t loss_nargs;
    PyObject *before, *after, *name;
} DrivenForward;

static PyObject *loss_forward_call(DrivenForward *self, PyObject *const *args, size_t nargsf, PyObject *kwnames);

static int
record_loss(Counters *c, PyObject *forward, PyObject *output)
{
    DrivenForward *self = (DrivenForward *)forward;
    if (Py_TYPE(output) != (PyTypeObject *)tensor_type)
        return HANDED_OVER;
    PyObject *value = PyObject_GetAttr(output, str_is_cpu);
    if (value == NULL)
        return -1;
    Py_DECREF(value);
    if (value != Py_True)
        return HANDED_OVER;
    if ((value = PyObject_GetAttr(output, str_layout)) == NULL)
        return -1;
    Py_DECREF(value);
    if (value != c->strided)
        return HANDED_OVER;
    if ((value = PyObject_GetAttr(output, str_dtype)) == NULL)
        return -1;
    PyObject *to_numpy = PyDict_GetItemWithError(c->plain_scalars, value);  /* borrowed */
    Py_DECREF(value);
    if (to_numpy == NULL)
        return PyErr_Occurred() ? -1 : HANDED_OVER;
    if ((value = PyObject_CallMethodNoArgs(output, str_dim)) == NULL)
        return -1;
    long dims = PyLong_AsLong(value);
    Py_DECREF(value);
    if (dims == -1 && PyErr_Occurred())
        return -1;
    if (dims != 0)
        return HANDED_OVER;
    if (self->save_raw) {
        PyObject *number = PyObject_CallMethodNoArgs(output, str_item);
        PyObject *saved = number != NULL ? PyObject_CallOneArg(to_numpy, number) : NULL;
        Py_XDECREF(number);
        int failed = saved == NULL || PyDict_SetItem(c->scalar_tensors, self->name, saved) < 0;
        Py_XDECREF(saved);
        if (failed)
            return -1;
    }
    if (self->save_shape && PyDict_SetItem(c->scalar_shapes, self->name, empty_tuple) < 0)
        return -1;
    return DONE;
}

static PyObject *
DrivenForward_call(DrivenForward *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs < 1 || args[0] != self->model)
        return PyObject_Vectorcall(self->original, args, nargsf, kwnames);
    if (self->is_loss)
        return loss_forward_call(self, args, nargsf, kwnames);
    Counters *c = self->counters;
    PyObject *module = args[0];
    int wanted = 0;
    int outcome = forward_begins(c, module, self->plain_getattr, &wanted);
    if (outcome < 0)
        return NULL;
    if (outcome == DONE) {
        c->routine++;
    }
    else {
        PyObject *answer = hand_over(c, c->slow_begin, &module, 1);
        if (answer == NULL)
            return NULL;  /* (StopTrainingRequested, from end_step) */
        wanted = PyObject_IsTrue(answer);
        Py_DECREF(answer);
        if (wanted < 0)
            return NULL;
    }
    PyObject *result = PyObject_Vectorcall(self->original, args, nargsf, kwnames);
    if (result == NULL || !wanted)
        return result;
    outcome = forward_ends(c);
    if (outcome == DONE) {
        c->routine++;
        return result;
    }
    PyObject *done = NULL;
    if (outcome == HANDED_OVER) {
        PyObject *positional = PyTuple_New(nargs - 1);  /* the forward's arguments, as a forward hook gets them */
        if (positional != NULL) {
            for (Py_ssize_t i = 1; i < nargs; i++) {
                Py_INCREF(args[i]);
                PyTuple_SET_ITEM(positional, i - 1, args[i]);
            }
            PyObject *slow_args[3] = {module, positional, result};
            done = hand_over(c, c->slow_end, slow_args, 3);
            Py_DECREF(positional);
        }
    }
    if (done == NULL) {
        Py_DECREF(result);
        return NULL;
    }
    Py_DECREF(done);
    return result;
}

/* after(module, args, output) of a loss module's forward (the positional arguments as a
   forward hook gets them); returns `output`, or NULL (output released) on an error. */
static PyObject *
call_after(DrivenForward *self, PyObject *const *args, Py_ssize_t nargs, PyObject *output)
{
    PyObject *positional = PyTuple_New(nargs - 1);
    PyObject *done = NULL;
    if (positional != NULL) {
        for (Py_ssize_t i = 1; i < nargs; i++) {
            Py_INCREF(args[i]);
            PyTuple_SET_ITEM(positional, i - 1, args[i]);
        }
        PyObject *after_args[3] = {args[0], positional, output};
        done = PyObject_Vectorcall(self->after, after_args, 3, NULL);
        Py_DECREF(positional);
    }
    if (done == NULL) {
        Py_DECREF(output);
        return NULL;
    }
    Py_DECREF(done);
    return output;
}

/* A registered loss module's forward: at an open scalar step whose losses save, with the
   arguments of the armed plan (plain tensors), its output is saved here; otherwise (and
   when that output is not one read here) the driver's Python way: `before(module)`, the
   forward, and `after(module, args, output)` when before said so (driver.drive_forward). */
static PyObject *
loss_forward_call(DrivenForward *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Counters *c = self->counters;
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (scalar_open(c) && c->loss_armed) {
        int plain = self->armed && kwnames == NULL && nargs - 1 == self->loss_nargs && failsafe_enabled(c, c->failsafe);
        for (Py_ssize_t i = 1; plain && i < nargs; i++)
            plain = Py_TYPE(args[i]) == (PyTypeObject *)tensor_type;
        if (plain) {
            PyObject *output = PyObject_Vectorcall(self->original, args, nargsf, kwnames);
            if (output == NULL)
                return NULL;
            int outcome = record_loss(c, (PyObject *)self, output);
            if (outcome == DONE) {
                c->routine++;
                return output;
            }
            if (outcome < 0) {  /* the contract: nothing escapes into training */
                if (hand_to(c->failsafe) < 0) {
                    Py_DECREF(output);
                    return NULL;
                }
                return output;
            }
            if (promote(c) < 0) {  /* Python saves this output its general way */
                Py_DECREF(output);
                return NULL;
            }
            c->handed_over++;
            return call_after(self, args, nargs, output);
        }
        if (promote(c) < 0)
            return NULL;
    }
    else if (c->step == c->idle) {
        /* A step where nothing is due: its losses save nothing (_loss_begins says False). */
        c->routine++;
        return PyObject_Vectorcall(self->original, args, nargsf, kwnames);
    }
    c->handed_over++;
    PyObject *answer = PyObject_CallOneArg(self->before, args[0]);
    if (answer == NULL)
        return NULL;
    int wanted = PyObject_IsTrue(answer);
    Py_DECREF(answer);
    if (wanted < 0)
        return NULL;
    PyObject *output = PyObject_Vectorcall(self->original, args, nargsf, kwnames);
    if (output == NULL || !wanted)
        return output;
    return call_after(self, args, nargs, output);
}

static PyObject *
DrivenForward_arm(DrivenForward *self, PyObject *args)
{
    PyObject *name;
    int save_raw, save_shape;
    Py_ssize_t nargs;
    if (!PyArg_ParseTuple(args, "Uppn:arm", &name, &save_raw, &save_shape, &nargs))
        return NULL;
    if (!self->is_loss) {
        PyErr_SetString(PyExc_TypeError, "arm: not a loss module's forward");
        return NULL;
    }
    Py_INCREF(name);
    replace(&self->name, name);
    self->save_raw = save_raw;
    self->save_shape = save_shape;
    self->loss_nargs = nargs;
    self->armed = 1;
    Py_RETURN_NONE;
}

static PyObject *
DrivenForward_disarm(DrivenForward *self, PyObject *unused)
{
    self->armed = 0;
    Py_RETURN_NONE;
}

static PyMethodDef DrivenForward_methods[] = {
    {"arm", (PyCFunction)DrivenForward_arm, METH_VARARGS,
     "arm(name, save_raw, save_shape, nargs): a loss module's forward saves its output as `name` at scalar steps "
     "(called with `nargs` plain tensors)."},
    {"disarm", (PyCFunction)DrivenForward_disarm, METH_NOARGS, "Save nothing here: the Python way only."},
    {NULL, NULL, 0, NULL},
};

/* `instance.forward`: a BoundForward (not a types.MethodType, whose __func__ would have to
   be a Python function for inspect and TorchDynamo). Each call of the driven model reads
   it (nn.Module._call_impl), so the driven model's is made once. */
static PyObject *bound_forward(DrivenForward *forward, PyObject *instance);

static PyObject *
DrivenForward_get(PyObject *self, PyObject *instance, PyObject *owner)
{
    DrivenForward *forward = (DrivenForward *)self;
    if (instance == NULL || instance == Py_None) {
        Py_INCREF(self);
        return self;
    }
    if (instance != forward->model)
        return bound_forward(forward, instance);
    if (forward->bound == NULL && (forward->bound = bound_forward(forward, instance)) == NULL)
        return NULL;
    Py_INCREF(forward->bound);
    return forward->bound;
}

static PyObject *
driven_forward(Counters *c, PyObject *model, PyObject *original, PyObject *before, PyObject *after)
{
    if (!PyCallable_Check(original) || (before != NULL && (!PyCallable_Check(before) || !PyCallable_Check(after)))) {
        PyErr_SetString(PyExc_TypeError, "forward: the original forward and the callbacks must be callable");
        return NULL;
    }
    DrivenForward *self = PyObject_GC_New(DrivenForward, &DrivenForwardType);
    if (self == NULL)
        return NULL;
    self->is_loss = before != NULL;
    self->armed = self->save_raw = self->save_shape = 0;
    self->loss_nargs = 0;
    self->before = Py_XNewRef(before);
    self->after = Py_XNewRef(after);
    self->name = NULL;
    Py_INCREF(c);
    self->counters = c;
    Py_INCREF(model);
    self->model = model;
    Py_INCREF(original);
    self->original = original;
    self->dict = NULL;
    self->bound = NULL;
    self->vectorcall = (vectorcallfunc)DrivenForward_call;
    PyObject *getattribute = PyObject_GetAttrString((PyObject *)Py_TYPE(model), "__getattribute__");
    PyObject *plain = PyObject_GetAttrString((PyObject *)&PyBaseObject_Type, "__getattribute__");
    self->plain_getattr = getattribute != NULL && getattribute == plain;
    Py_XDECREF(getattribute);
    Py_XDECREF(plain);
    PyErr_Clear();
    PyObject_GC_Track(self);
    return (PyObject *)self;
}

static PyObject *
Counters_forward(Counters *c, PyObject *args)
{
    PyObject *model, *original;
    if (!PyArg_ParseTuple(args, "OO:forward", &model, &original))
        return NULL;
    return driven_forward(c, model, original, NULL, NULL);
}

static PyObject *
Counters_loss_forward(Counters *c, PyObject *args)
{
    PyObject *model, *original, *before, *after;
    if (!PyArg_ParseTuple(args, "OOOO:loss_forward", &model, &original, &before, &after))
        return NULL;
    return driven_forward(c, model, original, before, after);
}

static int
DrivenForward_traverse(DrivenForward *self, visitproc visit, void *arg)
{
    DRIVEN_FORWARD_FIELDS(VISIT_FIELD)
    return 0;
}

static int
DrivenForward_clear(DrivenForward *self)
{
    DRIVEN_FORWARD_FIELDS(CLEAR_FIELD)
    return 0;
}

static void
DrivenForward_dealloc(DrivenForward *self)
{
    PyObject_GC_UnTrack(self);
    DrivenForward_clear(self);
    PyObject_GC_Del(self);
}

static PyGetSetDef DrivenForward_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject DrivenForwardType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "stepscope_torch._fastpath.DrivenForward",
    .tp_doc = "The driven model's forward: the hook's step entry points around the original forward.",
    .tp_basicsize = sizeof(DrivenForward),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL | Py_TPFLAGS_METHOD_DESCRIPTOR,
    .tp_vectorcall_offset = offsetof(DrivenForward, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_descr_get = DrivenForward_get,
    .tp_dictoffset = offsetof(DrivenForward, dict),
    .tp_getset = DrivenForward_getset,
    .tp_methods = DrivenForward_methods,
    .tp_traverse = (traverseproc)DrivenForward_traverse,
    .tp_clear = (inquiry)DrivenForward_clear,
    .tp_dealloc = (destructor)DrivenForward_dealloc,
};

/* ---- BoundForward: `model.forward` ---------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    DrivenForward *forward;
    PyObject *instance;
    vectorcallfunc vectorcall;
} BoundForward;

static PyObject *
BoundForward_call(BoundForward *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    /* The instance in front of the arguments, as a bound method does: in the slot before
       them where the caller lends it, else in a copy. */
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargsf & PY_VECTORCALL_ARGUMENTS_OFFSET) {
        PyObject **front = (PyObject **)args - 1;
        PyObject *saved = *front;
        *front = self->instance;
        PyObject *result = DrivenForward_call(self->forward, front, nargs + 1, kwnames);
        *front = saved;
        return result;
    }
    Py_ssize_t total = nargs + (kwnames != NULL ? PyTuple_GET_SIZE(kwnames) : 0);
    PyObject *small[8];
    PyObject **all = total + 1 <= 8 ? small : PyMem_Malloc((total + 1) * sizeof(PyObject *));
    if (all == NULL)
        return PyErr_NoMemory();
    all[0] = self->instance;
    memcpy(all + 1, args, total * sizeof(PyObject *));
    PyObject *result = DrivenForward_call(self->forward, all, nargs + 1, kwnames);
    if (all != small)
        PyMem_Free(all);
    return result;
}

static PyObject *
bound_forward(DrivenForward *forward, PyObject *instance)
{
    BoundForward *self = PyObject_GC_New(BoundForward, &BoundForwardType);
    if (self == NULL)
        return NULL;
    Py_INCREF(forward);
    self->forward = forward;
    Py_INCREF(instance);
    self->instance = instance;
    self->vectorcall = (vectorcallfunc)BoundForward_call;
    PyObject_GC_Track(self);
    return (PyObject *)self;
}

/* What introspection asks of a bound method: __self__, __func__, and __wrapped__ (the
   original forward bound to the instance, so inspect.signature shows the model's own
   signature); anything else (__name__, __doc__, ...) from the forward. */
static PyObject *
BoundForward_getattro(BoundForward *self, PyObject *name)
{
    if (PyUnicode_Check(name)) {
        if (PyUnicode_CompareWithASCIIString(name, "__self__") == 0) {
            Py_INCREF(self->instance);
            return self->instance;
        }
        if (PyUnicode_CompareWithASCIIString(name, "__func__") == 0) {
            Py_INCREF(self->forward);
            return (PyObject *)self->forward;
        }
        if (PyUnicode_CompareWithASCIIString(name, "__wrapped__") == 0)
            return PyMethod_New(self->forward->original, self->instance);
    }
    PyObject *found = PyObject_GenericGetAttr((PyObject *)self, name);
    if (found != NULL || !PyErr_ExceptionMatches(PyExc_AttributeError))
        return found;
    PyErr_Clear();
    return PyObject_GetAttr((PyObject *)self->forward, name);
}

static PyObject *
BoundForward_repr(BoundForward *self)
{
    return PyUnicode_FromFormat("<bound stepscope forward of %R>", self->instance);
}

static int
BoundForward_traverse(BoundForward *self, visitproc visit, void *arg)
{
    BOUND_FORWARD_FIELDS(VISIT_FIELD)
    return 0;
}

static int
BoundForward_clear(BoundForward *self)
{
    BOUND_FORWARD_FIELDS(CLEAR_FIELD)
    return 0;
}

static void
BoundForward_dealloc(BoundForward *self)
{
    PyObject_GC_UnTrack(self);
    BoundForward_clear(self);
    PyObject_GC_Del(self);
}

static PyTypeObject BoundForwardType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "stepscope_torch._fastpath.BoundForward",
    .tp_doc = "The driven model's forward, bound to the model.",
    .tp_basicsize = sizeof(BoundForward),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(BoundForward, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_getattro = (getattrofunc)BoundForward_getattro,
    .tp_repr = (reprfunc)BoundForward_repr,
    .tp_traverse = (traverseproc)BoundForward_traverse,
    .tp_clear = (inquiry)BoundForward_clear,
    .tp_dealloc = (destructor)BoundForward_dealloc,
};

/* ---- module ------------------------------------------------------------------------- */

static struct PyModuleDef fastpath_module = {
    PyModuleDef_HEAD_INIT, "_fastpath", "The compiled hot path of stepscope_torch.Hook (see fastpath.py).", -1, NULL,
};

PyMODINIT_FUNC
PyInit__fastpath(void)
{
    str_training = PyUnicode_InternFromString("training");
    str_fail = PyUnicode_InternFromString("fail");
    PyObject **names[] = {&str_is_cpu, &str_layout, &str_dtype, &str_dim, &str_item, &str_tensors, &str_shapes, &str_due_names, &str_state};
    const char *texts[] = {"is_cpu", "layout", "dtype", "dim", "item", "tensors", "shapes", "due_names", "state"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if ((*names[i] = PyUnicode_InternFromString(texts[i])) == NULL)
            return NULL;
    if ((empty_tuple = PyTuple_New(0)) == NULL)
        return NULL;
    PyObject *time = PyImport_ImportModule("time");
    if (str_training == NULL || str_fail == NULL || time == NULL)
        return NULL;
    perf_counter_ns = PyObject_GetAttrString(time, "perf_counter_ns");
    perf_counter = PyObject_GetAttrString(time, "perf_counter");
    Py_DECREF(time);
    if (perf_counter_ns == NULL || perf_counter == NULL)
        return NULL;
    PyObject *torch = PyImport_ImportModule("torch");
    if (torch == NULL)
        return NULL;
    is_grad_enabled = PyObject_GetAttrString(torch, "is_grad_enabled");
    tensor_type = PyObject_GetAttrString(torch, "Tensor");
    Py_DECREF(torch);
    if (is_grad_enabled == NULL || tensor_type == NULL)
        return NULL;
    if (PyType_Ready(&CountersType) < 0 || PyType_Ready(&ModeTableType) < 0 || PyType_Ready(&DrivenForwardType) < 0
            || PyType_Ready(&BoundForwardType) < 0 || PyType_Ready(&WordsType) < 0)
        return NULL;
    PyObject *module = PyModule_Create(&fastpath_module);
    if (module == NULL)
        return NULL;
    Py_INCREF(&CountersType);
    if (PyModule_AddObject(module, "Counters", (PyObject *)&CountersType) < 0) {
        Py_DECREF(&CountersType);
        Py_DECREF(module);
        return NULL;
    }
    return module;
}

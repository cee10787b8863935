/* Small files published in one call with the GIL released (see store/local.py,
   `LocalStore.write_many`).

   A batch of steps that saved only losses and metrics is one event file and one index file
   per step (smdebug's reader finds a step by its index file). Published from Python, each
   small file is four system calls (open the temporary, write, close, rename), and after
   each the writer's thread takes the GIL back: about four turns at the GIL per training
   step, each of which can make the training thread wait when it comes back from a torch
   operation. Here a whole run of small files in one folder is published with the GIL
   released once, with the same guarantees as `_publish_with`: each file is written whole
   under a temporary name unique to this process and renamed over its name (a link or
   special file at the name is replaced, never written through: O_EXCL | O_NOFOLLOW on
   the temporary, rename never follows), and a temporary that could not be completed is
   removed. Where the file system has unnamed files (Linux's O_TMPFILE: ext4, XFS, Btrfs,
   tmpfs) a file is written unnamed and linked in under its name instead, which the
   temporary name's two directory changes cost more than (publish_unnamed). */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#ifdef _WIN32
#error "POSIX only: Windows publishes from Python"
#endif

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#ifndef O_CLOEXEC
#define O_CLOEXEC 0
#endif

typedef struct {
    const char *tmp, *name, *data;
    Py_ssize_t size;
} Item;

/* Write `size` bytes of `data` to `fd`, resuming after short writes and signals. 0 or errno. */
static int
write_all(int fd, const char *data, Py_ssize_t size)
{
    while (size > 0) {
        ssize_t done = write(fd, data, (size_t)size);
        if (done < 0) {
            if (errno == EINTR)
                continue;
            return errno;
        }
        data += done;
        size -= done;
    }
    return 0;
}

#ifdef O_TMPFILE
/* Whether this process's file systems take unnamed files: cleared, for the process's life,
   at the first sign that one does not (threads may race to clear it; nothing sets it). */
static volatile int unnamed_works = 1;

/* One file written unnamed (O_TMPFILE) and linked in under its name: the same guarantees
   as the temporary name and rename below (nothing is visible under the name until the
   file is whole; nothing is left behind on an error: an unnamed file goes with its
   descriptor) with two directory changes fewer, which is what creating a small file costs
   (python bench/publish_files.py). 0: published; -1: not published this way (the
   caller goes on with the temporary name: the file system has no unnamed files, /proc is
   not mounted, or something is at the name already, which only a rename may replace);
   otherwise the errno of the write. */
static int
publish_unnamed(int folder, const Item *item)
{
    if (!unnamed_works)
        return -1;
    int fd = openat(folder, ".", O_WRONLY | O_TMPFILE | O_CLOEXEC, 0644);
    if (fd < 0) {
        if (errno == EOPNOTSUPP || errno == EISDIR || errno == EINVAL || errno == ENOENT)
            unnamed_works = 0;
        return -1;
    }
    int error = write_all(fd, item->data, item->size);
    if (error == 0) {
        /* (linkat(fd, "", ..., AT_EMPTY_PATH) needs CAP_DAC_READ_SEARCH; the /proc link
           of the descriptor does not.) */
        char path[40];
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
        if (linkat(AT_FDCWD, path, folder, item->name, AT_SYMLINK_FOLLOW) != 0) {
            if (errno != EEXIST)
                unnamed_works = 0;
            error = -1;
        }
    }
    close(fd);
    return error;
}
#endif

/* One file: 0, or the errno of the step that failed (the temporary removed). */
static int
publish_one(int folder, const Item *item)
{
#ifdef O_TMPFILE
    int unnamed = publish_unnamed(folder, item);
    if (unnamed >= 0)
        return unnamed;
#endif
    int fd = openat(folder, item->tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0)
        return errno;
    int error = write_all(fd, item->data, item->size);
    if (close(fd) != 0 && error == 0 && errno != EINTR)
        error = errno;
    if (error == 0 && renameat(folder, item->tmp, folder, item->name) != 0)
        error = errno;
    if (error != 0)
        unlinkat(folder, item->tmp, 0);
    return error;
}

/* publish_small(folder_fd, files): `files` a list of (temporary name, name, bytes). Returns
   (published, error): how many were published, in order, and None or the OSError (naming
   the file) that stopped the rest. */
static PyObject *
publish_small(PyObject *module, PyObject *args)
{
    int folder;
    PyObject *files;
    if (!PyArg_ParseTuple(args, "iO!:publish_small", &folder, &PyList_Type, &files))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(files);
    Item *items = PyMem_Malloc((n > 0 ? n : 1) * sizeof(Item));
    if (items == NULL)
        return PyErr_NoMemory();
    /* The list is held (and its tuples, strings and bytes with it) while the GIL is
       released: nothing here can change them, the caller made them for this call. */
    Py_INCREF(files);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *entry = PyList_GET_ITEM(files, i);
        if (!PyTuple_CheckExact(entry) || PyTuple_GET_SIZE(entry) != 3 || !PyUnicode_Check(PyTuple_GET_ITEM(entry, 0))
                || !PyUnicode_Check(PyTuple_GET_ITEM(entry, 1)) || !PyBytes_CheckExact(PyTuple_GET_ITEM(entry, 2))) {
            PyErr_Format(PyExc_TypeError, "publish_small: item %zd is not (temporary name, name, bytes)", i);
            goto fail;
        }
        items[i].tmp = PyUnicode_AsUTF8(PyTuple_GET_ITEM(entry, 0));
        items[i].name = PyUnicode_AsUTF8(PyTuple_GET_ITEM(entry, 1));
        if (items[i].tmp == NULL || items[i].name == NULL)
            goto fail;
        if (strchr(items[i].tmp, '/') != NULL || strchr(items[i].name, '/') != NULL) {
            PyErr_Format(PyExc_ValueError, "publish_small: %R is not a name within the folder", PyTuple_GET_ITEM(entry, 1));
            goto fail;
        }
        items[i].data = PyBytes_AS_STRING(PyTuple_GET_ITEM(entry, 2));
        items[i].size = PyBytes_GET_SIZE(PyTuple_GET_ITEM(entry, 2));
    }
    Py_ssize_t done = 0;
    int error = 0;
    Py_BEGIN_ALLOW_THREADS
    while (done < n && (error = publish_one(folder, &items[done])) == 0)
        done++;
    Py_END_ALLOW_THREADS
    PyObject *exc = Py_None;
    Py_INCREF(exc);
    if (error != 0) {
        Py_DECREF(exc);
        PyObject *name = PyTuple_GET_ITEM(PyList_GET_ITEM(files, done), 1);
        exc = PyObject_CallFunction(PyExc_OSError, "isO", error, strerror(error), name);
        if (exc == NULL)
            goto fail;
    }
    PyMem_Free(items);
    Py_DECREF(files);
    PyObject *result = Py_BuildValue("(nN)", done, exc);
    return result;
fail:
    PyMem_Free(items);
    Py_DECREF(files);
    return NULL;
}

/* Large copies into the staging buffer go around the caches (x86-64's streaming stores):
   the device reads the buffer from memory, so stored through the caches its bytes would
   only evict as many of the training's, and each line would be read before it is
   written. streaming_stores() turns it off (a benchmark compares the two). */
static int streaming = 1;

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <emmintrin.h>
#include <stdint.h>

static void
copy_large(char *to, const char *from, size_t n)
{
    if (!streaming) {
        memcpy(to, from, n);
        return;
    }
    size_t head = (16 - ((uintptr_t)to & 15)) & 15;
    memcpy(to, from, head);
    to += head;
    from += head;
    n -= head;
    for (; n >= 64; to += 64, from += 64, n -= 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)from), b = _mm_loadu_si128((const __m128i *)(from + 16)),
                c = _mm_loadu_si128((const __m128i *)(from + 32)), d = _mm_loadu_si128((const __m128i *)(from + 48));
        _mm_stream_si128((__m128i *)to, a);
        _mm_stream_si128((__m128i *)(to + 16), b);
        _mm_stream_si128((__m128i *)(to + 32), c);
        _mm_stream_si128((__m128i *)(to + 48), d);
    }
    memcpy(to, from, n);
    _mm_sfence(); /* (ordered before the write that hands the buffer to the device) */
}
#else
static void
copy_large(char *to, const char *from, size_t n)
{
    memcpy(to, from, n);
}
#endif

/* streaming_stores(on, /) -> bool: whether stage's large copies go around the caches from now
   on (the default); the setting before. */
static PyObject *
streaming_stores(PyObject *module, PyObject *arg)
{
    int on = PyObject_IsTrue(arg);
    if (on < 0)
        return NULL;
    int before = streaming;
    streaming = on;
    return PyBool_FromLong(before);
}

/* stage(into, fill, views, index, offset) -> (fill, index, offset): copy the bytes of
   `views` (a list of buffers), from byte `offset` of views[index] on, into the writable
   buffer `into` from byte `fill` on, until `into` is full or the views are all copied; returns
   where it stopped. direct_io.write_direct's staging copy: a save's file is a few dozen
   buffers (each tensor's record head, bytes and tail), and copied from Python one by one each
   was a numpy call or two, half a millisecond a save of the publishing thread's CPU. Large
   copies run with the GIL released. */
static PyObject *
stage(PyObject *module, PyObject *args)
{
    Py_buffer into;
    Py_ssize_t fill, index, offset;
    PyObject *views;
    if (!PyArg_ParseTuple(args, "w*nO!nn:stage", &into, &fill, &PyList_Type, &views, &index, &offset))
        return NULL;
    if (fill < 0 || fill > into.len || index < 0 || index > PyList_GET_SIZE(views) || offset < 0) {
        PyErr_Format(PyExc_ValueError, "stage: fill %zd of %zd, view %zd of %zd at %zd: out of range", fill, into.len, index,
                     PyList_GET_SIZE(views), offset);
        PyBuffer_Release(&into);
        return NULL;
    }
    while (index < PyList_GET_SIZE(views) && fill < into.len) {
        Py_buffer view;
        if (PyObject_GetBuffer(PyList_GET_ITEM(views, index), &view, PyBUF_SIMPLE) < 0) {
            PyBuffer_Release(&into);
            return NULL;
        }
        if (offset > view.len) {
            PyErr_Format(PyExc_ValueError, "stage: offset %zd past the end of view %zd (%zd bytes)", offset, index, view.len);
            PyBuffer_Release(&view);
            PyBuffer_Release(&into);
            return NULL;
        }
        Py_ssize_t n = view.len - offset < into.len - fill ? view.len - offset : into.len - fill;
        char *to = (char *)into.buf + fill;
        const char *from = (const char *)view.buf + offset;
        if (n >= 65536) {
            Py_BEGIN_ALLOW_THREADS
            copy_large(to, from, (size_t)n);
            Py_END_ALLOW_THREADS
        } else if (n > 0)
            memcpy(to, from, (size_t)n);
        fill += n;
        offset += n;
        if (offset == view.len) {
            index++;
            offset = 0;
        }
        PyBuffer_Release(&view);
    }
    PyBuffer_Release(&into);
    return Py_BuildValue("(nnn)", fill, index, offset);
}

/* unnamed_files(): whether files are still published unnamed (publish_unnamed) in this
   process: False where O_TMPFILE is not built in or something refused it. */
static PyObject *
unnamed_files(PyObject *module, PyObject *Py_UNUSED(ignored))
{
#ifdef O_TMPFILE
    return PyBool_FromLong(unnamed_works);
#else
    return PyBool_FromLong(0);
#endif
}

static PyMethodDef methods[] = {
    {"streaming_stores", streaming_stores, METH_O,
     "streaming_stores(on, /) -> bool: whether stage's large copies go around the caches from now on (the default); the setting "
     "before. For benchmarks that compare the two."},
    {"unnamed_files", unnamed_files, METH_NOARGS,
     "unnamed_files() -> bool: whether small files are published unnamed and linked in (O_TMPFILE) in this process."},
    {"publish_small", publish_small, METH_VARARGS,
     "publish_small(folder_fd, [(temporary name, name, bytes), ...]) -> (published, OSError or None): small files "
     "published in order, each written whole (unnamed and linked in where the file system allows, else under its "
     "temporary name and renamed over its name), the GIL released."},
    {"stage", stage, METH_VARARGS,
     "stage(into, fill, views, index, offset) -> (fill, index, offset): the views' bytes from views[index][offset:] on copied "
     "into into[fill:] until it is full or they are all copied (direct_io.write_direct's staging copy)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef publish_module = {
    PyModuleDef_HEAD_INIT, "_publish", "Small files published with the GIL released (store/local.py).", -1, methods,
};

PyMODINIT_FUNC
PyInit__publish(void)
{
    return PyModule_Create(&publish_module);
}

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

#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* (O_DIRECT, fallocate) */
#endif
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#ifdef _WIN32
#error "POSIX only: Windows publishes from Python"
#endif

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>
#include <sys/uio.h>
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

/* ---- a large file written around the page cache, whole, in one call ------------------

   direct_io.py says why (O_DIRECT: no page-cache copy, no write-back) and what the layout
   is: a snapshot's bytes of PLACE_FROM or more that start on an aligned address at an
   aligned file offset (behind the framer's padding record) are handed to the device where
   they are; everything between them is copied into the thread's aligned staging buffer;
   only the file's unaligned end goes through the page cache. From Python this was some
   sixty calls a save (views made, addresses asked, segments cut, the temporary opened,
   written, closed and renamed), each a turn at the GIL that the training thread may have
   to wait out and each run on cold caches once every few steps: 0.2 ms of the publishing
   thread's CPU per 3.2 MB save beside the write's own. Here the whole file, from the
   temporary's open to the rename, is one call with the GIL released once. */

#if defined(O_DIRECT) && defined(__linux__)

#define MAX_SEGMENTS 512 /* (IOV_MAX is 1024 on Linux) */

/* A failure the next publish_direct meets, for tests (inject_fault): the kernel gives these
   only on file systems and in states a test cannot make (a refusal after the open, a short
   write). Consumed where it strikes. */
enum { FAULT_NONE, FAULT_OPEN, FAULT_WRITE, FAULT_SHORT, FAULT_SHORT_ALIGNED };
static int fault = FAULT_NONE, fault_errno = 0;

typedef struct {
    int fd;
    int direct; /* the descriptor still writes around the page cache */
    char *staging;
    Py_ssize_t capacity, fill, mark; /* staged bytes; where those not yet in `seg` start */
    Py_ssize_t align;
    Py_ssize_t placed; /* bytes written from where they were, not staged */
    struct iovec seg[MAX_SEGMENTS];
    int count;
} Direct;

/* Turn O_DIRECT off for the rest of the file (its unaligned end, or after a short write).
   0 or errno. */
static int
go_plain(Direct *d)
{
    int flags = fcntl(d->fd, F_GETFL);
    if (flags < 0 || fcntl(d->fd, F_SETFL, flags & ~O_DIRECT) < 0)
        return errno;
    d->direct = 0;
    return 0;
}

/* Write the gathered segments. A short write leaves the next offset anywhere: the rest goes
   through the page cache. 0, errno, or -1 where the file system refused a direct write
   (EINVAL: the caller writes the file again the usual way). */
static int
write_segments(Direct *d)
{
    struct iovec *iov = d->seg;
    int n = d->count;
    d->count = 0;
    while (n > 0) {
        ssize_t done;
        if (fault == FAULT_SHORT && d->direct && iov->iov_len > (size_t)d->align + 7) {
            /* What a signal or a full disk can do: an unaligned amount written. */
            fault = FAULT_NONE;
            int error = go_plain(d);
            done = error != 0 ? -1 : write(d->fd, iov->iov_base, (size_t)d->align + 7);
            if (error != 0 || fcntl(d->fd, F_SETFL, fcntl(d->fd, F_GETFL) | O_DIRECT) < 0)
                return error != 0 ? error : errno;
            d->direct = 1;
        } else if (fault == FAULT_SHORT_ALIGNED && d->direct && iov->iov_len > (size_t)d->align) {
            /* What Linux does to a write of 2 GiB or more: a whole number of blocks written. */
            fault = FAULT_NONE;
            done = write(d->fd, iov->iov_base, (size_t)d->align);
        } else if (fault == FAULT_WRITE && d->direct) {
            fault = FAULT_NONE;
            errno = fault_errno;
            done = -1;
        } else
            done = writev(d->fd, iov, n);
        if (done < 0) {
            if (errno == EINTR)
                continue;
            return d->direct && errno == EINVAL ? -1 : errno;
        }
        if (done == 0)
            return EIO; /* (a regular file never takes nothing; do not spin) */
        while (n > 0 && (size_t)done >= iov->iov_len) {
            done -= (ssize_t)iov->iov_len;
            iov++;
            n--;
        }
        if (n > 0) {
            iov->iov_base = (char *)iov->iov_base + done;
            iov->iov_len -= (size_t)done;
            /* A short write that ended on a block boundary (Linux writes at most 2 GiB less a
               page in one call) leaves every segment still aligned: the rest stays direct.
               Anywhere else, the next offset is unaligned: the rest goes through the page
               cache. */
            if (d->direct && done % d->align != 0) {
                int error = go_plain(d);
                if (error != 0)
                    return error;
            }
        }
    }
    return 0;
}

static int
add_segment(Direct *d, const char *base, Py_ssize_t size)
{
    if (d->count == MAX_SEGMENTS) {
        int error = write_segments(d);
        if (error != 0)
            return error;
    }
    d->seg[d->count].iov_base = (void *)base;
    d->seg[d->count].iov_len = (size_t)size;
    d->count++;
    return 0;
}

/* The staged bytes so far become a segment. (They end on an aligned file offset: the staging
   buffer's position is always the file offset's remainder by `align`, and what comes next is
   a placed view or the buffer's end.) */
static int
cut(Direct *d)
{
    if (d->fill == d->mark)
        return 0;
    int error = add_segment(d, d->staging + d->mark, d->fill - d->mark);
    d->mark = d->fill;
    return error;
}

static int
stage_bytes(Direct *d, const char *from, Py_ssize_t size)
{
    while (size > 0) {
        Py_ssize_t n = size < d->capacity - d->fill ? size : d->capacity - d->fill;
        if (n >= 65536)
            copy_large(d->staging + d->fill, from, (size_t)n);
        else
            memcpy(d->staging + d->fill, from, (size_t)n);
        d->fill += n;
        from += n;
        size -= n;
        if (d->fill == d->capacity) {
            int error = cut(d);
            if (error == 0)
                error = write_segments(d);
            if (error != 0)
                return error;
            d->fill = d->mark = 0;
        }
    }
    return 0;
}

/* The file's bytes, `parts` in order: placed where they qualify, staged otherwise, the
   unaligned end through the page cache. 0, errno or -1 (refused). */
static int
write_parts(Direct *d, const Py_buffer *parts, Py_ssize_t n, Py_ssize_t place_from)
{
    Py_ssize_t offset = 0;
    int error = 0;
    for (Py_ssize_t i = 0; i < n && error == 0; i++) {
        const char *data = parts[i].buf;
        Py_ssize_t size = parts[i].len;
        if (size >= place_from && offset % d->align == 0 && (uintptr_t)data % (uintptr_t)d->align == 0) {
            Py_ssize_t whole = size - size % d->align;
            error = cut(d);
            if (error == 0)
                error = add_segment(d, data, whole);
            d->placed += whole;
            if (error == 0)
                error = stage_bytes(d, data + whole, size - whole);
        } else
            error = stage_bytes(d, data, size);
        offset += size;
    }
    if (error != 0)
        return error;
    Py_ssize_t aligned = d->fill - d->fill % d->align;
    if (aligned > d->mark) {
        error = add_segment(d, d->staging + d->mark, aligned - d->mark);
        d->mark = aligned;
    }
    if (error == 0)
        error = write_segments(d);
    if (error == 0 && d->fill > aligned) {
        if (d->direct)
            error = go_plain(d);
        if (error == 0)
            error = write_all(d->fd, d->staging + aligned, d->fill - aligned);
    }
    return error;
}

/* One large file published around the page cache from the held buffers `views` (`size`
   bytes in all), the GIL released: the temporary `tmp` opened in `folder` with `flags` and
   O_DIRECT, the bytes written by write_parts, closed, renamed over `name` (removed on any
   failure). 0, or the errno of the step that failed (`*step` names it); `*refused` is set
   where the file system refused a direct write (EINVAL: the caller writes the file the
   usual way). `d` holds the staging buffer and alignment; its `placed` counts the bytes
   written from where they were. */
static int
direct_file(Direct *d, int folder, const char *tmp, const char *name, const Py_buffer *views, Py_ssize_t n, Py_ssize_t size, int flags,
            Py_ssize_t place_from, Py_ssize_t preallocate_from, int *refused, const char **step) /* fmt: skip */
{
    int error = 0;
    *refused = 0;
    *step = "open";
    if (fault == FAULT_OPEN) {
        fault = FAULT_NONE;
        errno = fault_errno;
        d->fd = -1;
    } else
        d->fd = openat(folder, tmp, flags | O_DIRECT, 0644);
    if (d->fd < 0) {
        error = errno;
        *refused = error == EINVAL;
        return error;
    }
    if (size >= preallocate_from)
        (void)fallocate(d->fd, FALLOC_FL_KEEP_SIZE, 0, (off_t)size); /* (a reservation only: failing costs nothing) */
    *step = "write";
    error = write_parts(d, views, n, place_from);
    if (error == -1) {
        *refused = 1;
        error = EINVAL;
    }
    if (close(d->fd) != 0 && error == 0 && errno != EINTR) {
        error = errno;
        *step = "close";
    }
    if (error == 0 && renameat(folder, tmp, folder, name) != 0) {
        error = errno;
        *step = "rename";
    }
    if (error != 0)
        unlinkat(folder, tmp, 0);
    return error;
}

/* Whether a staging buffer fits direct writes of `align` bytes; if not, ValueError set. */
static int
staging_fits(const Py_buffer *staging, Py_ssize_t align, const char *caller)
{
    if (align <= 0 || (align & (align - 1)) != 0 || staging->len < align || staging->len % align != 0
            || (uintptr_t)staging->buf % (uintptr_t)align != 0) {
        PyErr_Format(PyExc_ValueError, "%s: the staging buffer (%zd bytes) is not a multiple of %zd bytes at an address aligned alike",
                     caller, staging->len, align);
        return 0;
    }
    return 1;
}

/* The OSError(errno, "reason (step)", name) of a failed file: the caller names the whole key. */
static PyObject *
file_error(int error, const char *step, const char *name)
{
    return PyObject_CallFunction(PyExc_OSError, "iNs", error, PyUnicode_FromFormat("%s (%s)", strerror(error), step), name);
}

/* publish_direct(folder_fd, tmp, name, parts, staging, flags, align, place_from, preallocate_from, /)
   -> int or str. See the method table. */
static PyObject *
publish_direct(PyObject *module, PyObject *args)
{
    int folder, flags;
    const char *tmp, *name;
    PyObject *parts;
    Py_buffer staging;
    Py_ssize_t align, place_from, preallocate_from;
    if (!PyArg_ParseTuple(args, "issO!w*innn:publish_direct", &folder, &tmp, &name, &PyList_Type, &parts, &staging, &flags, &align,
                          &place_from, &preallocate_from)) /* fmt: skip */
        return NULL;
    PyObject *result = NULL;
    Py_ssize_t n = PyList_GET_SIZE(parts), held = 0, size = 0;
    Direct d = {.fd = -1, .direct = 1, .staging = staging.buf, .capacity = staging.len, .align = align};
    int error = 0, refused = 0;
    const char *step = "open";
    Py_buffer *views = PyMem_Calloc(n > 0 ? (size_t)n : 1, sizeof(Py_buffer));
    if (views == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if (!staging_fits(&staging, align, "publish_direct"))
        goto done;
    if (strchr(tmp, '/') != NULL || strchr(name, '/') != NULL) {
        PyErr_Format(PyExc_ValueError, "publish_direct: %s is not a name within the folder", strchr(tmp, '/') != NULL ? tmp : name);
        goto done;
    }
    /* The list is the caller's, made for this call; its buffers are held while the GIL is
       released, so nothing can free or resize them. */
    for (; held < n; held++) {
        if (PyObject_GetBuffer(PyList_GET_ITEM(parts, held), &views[held], PyBUF_SIMPLE) < 0)
            goto done;
        size += views[held].len;
    }
    Py_BEGIN_ALLOW_THREADS
    error = direct_file(&d, folder, tmp, name, views, n, size, flags, place_from, preallocate_from, &refused, &step);
    Py_END_ALLOW_THREADS
    if (refused)
        result = PyUnicode_FromFormat("%s of %s: %s", step, name, strerror(error));
    else if (error != 0) {
        PyObject *exc = file_error(error, step, name);
        if (exc != NULL) {
            PyErr_SetObject(PyExc_OSError, exc);
            Py_DECREF(exc);
        }
    } else
        result = PyLong_FromSsize_t(d.placed);
done:
    for (Py_ssize_t i = 0; i < held; i++)
        PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    PyBuffer_Release(&staging);
    return result;
}

/* ---- a save's files in one call, from the job's root --------------------------------

   A save is two files in two folders: its event file (a new step folder) and its index
   file. Published from Python, that is two folder walks of a few system calls each, the
   event file's direct write, the index file's run, and Python between them: some fifty
   calls, each a turn at the GIL and each run on caches that training has made cold, about
   a quarter of the publishing thread's CPU per save (docs/pytorch.md#cost). Here the
   files of one write_many are published in order with the GIL released once, by the
   rules of the Python path (store/local.py): each folder on a key's way opened relative to
   its parent with O_NOFOLLOW and made where missing, each file whole under its name or
   absent. What this does not do it leaves to the Python path, which goes on from the
   first file not published: a root or folder that cannot be walked (the Python walk
   says why: a link, a file in the way), a file neither small nor for a direct write. */

#define MAX_KEY 4096

typedef struct {
    const char *folder, *tmp, *name;
    Py_buffer *views; /* the file's buffers: `n` from views[first] of the call's array */
    Py_ssize_t first, n, size;
    int small; /* one bytes object, written as publish_small writes it */
} File;

/* Room for one more buffer in `*views` (`*capacity` of them, grown by doubling). */
static int
room_for_one(Py_buffer **views, Py_ssize_t held, Py_ssize_t *capacity)
{
    if (held < *capacity)
        return 1;
    Py_ssize_t more = *capacity * 2;
    Py_buffer *grown = PyMem_Realloc(*views, (size_t)more * sizeof(Py_buffer));
    if (grown == NULL) {
        PyErr_NoMemory();
        return 0;
    }
    *views = grown;
    *capacity = more;
    return 1;
}

/* The folder `rel` ("a/b", "" for the root) below `root`, walked as _open_folder does
   (create=True): each component opened relative to the last with O_NOFOLLOW, made where
   missing. A new descriptor (or `root` itself for ""), or -1: the Python walk redoes it
   and says what is wrong. */
static int
walk(int root, const char *rel)
{
    char path[MAX_KEY];
    size_t length = strlen(rel);
    if (length == 0)
        return root;
    if (length >= sizeof path)
        return -1;
    memcpy(path, rel, length + 1);
    int fd = root;
    char *part = path;
    while (part != NULL) {
        char *slash = strchr(part, '/');
        if (slash != NULL)
            *slash = '\0';
        int child = -1;
        if (*part != '\0' && strcmp(part, ".") != 0 && strcmp(part, "..") != 0) {
            child = openat(fd, part, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (child < 0 && errno == ENOENT && (mkdirat(fd, part, 0777) == 0 || errno == EEXIST))
                child = openat(fd, part, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        }
        if (fd != root)
            close(fd);
        if (child < 0)
            return -1;
        fd = child;
        part = slash != NULL ? slash + 1 : NULL;
    }
    return fd;
}

/* publish_files(root, files, staging, flags, align, place_from, preallocate_from, direct_from,
   direct, small_max, /) -> (published, stop). See the method table. */
static PyObject *
publish_files(PyObject *module, PyObject *args)
{
    PyObject *root_path, *files, *staging_object;
    Py_buffer staging = {.buf = NULL, .obj = NULL};
    int flags, direct;
    Py_ssize_t align, place_from, preallocate_from, direct_from, small_max;
    if (!PyArg_ParseTuple(args, "O&O!Oinnnnpn:publish_files", PyUnicode_FSConverter, &root_path, &PyList_Type, &files, &staging_object,
                          &flags, &align, &place_from, &preallocate_from, &direct_from, &direct, &small_max)) /* fmt: skip */
        return NULL;
    PyObject *result = NULL;
    /* A tuple of the list's items, and of each file's parts below: what is used while the
       GIL is released (the names' bytes, the buffers) stays alive and in place whatever a
       buffer's exporter does meanwhile. */
    PyObject *entries = PySequence_Tuple(files);
    Py_ssize_t count = entries != NULL ? PyTuple_GET_SIZE(entries) : 0, ready = 0, held = 0, capacity = 8;
    File *items = PyMem_Calloc(count > 0 ? (size_t)count : 1, sizeof(File));
    Py_buffer *views = PyMem_Malloc((size_t)capacity * sizeof(Py_buffer));
    if (entries == NULL)
        goto done;
    if (items == NULL || views == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    /* (The staging buffer only for direct writes: None otherwise.) */
    if (direct && (PyObject_GetBuffer(staging_object, &staging, PyBUF_WRITABLE) < 0 || !staging_fits(&staging, align, "publish_files")))
        goto done;
    /* The files this call publishes: up to the first it leaves to the caller's path. */
    for (; ready < count; ready++) {
        PyObject *entry = PyTuple_GET_ITEM(entries, ready);
        if (!PyTuple_CheckExact(entry) || PyTuple_GET_SIZE(entry) != 4) {
            PyErr_Format(PyExc_TypeError, "publish_files: item %zd is not (folder, temporary name, name, data)", ready);
            goto done;
        }
        PyObject *data = PyTuple_GET_ITEM(entry, 3);
        File *f = &items[ready];
        for (int k = 0; k < 3; k++) {
            PyObject *text = PyTuple_GET_ITEM(entry, k);
            const char *utf8 = PyUnicode_Check(text) ? PyUnicode_AsUTF8(text) : NULL;
            if (utf8 == NULL) {
                PyErr_Clear(); /* (not a name this path writes: the caller's path says why) */
                goto prepared;
            }
            if (k == 0)
                f->folder = utf8;
            else if (k == 1)
                f->tmp = utf8;
            else
                f->name = utf8;
        }
        if (strchr(f->tmp, '/') != NULL || strchr(f->name, '/') != NULL || strlen(f->folder) >= MAX_KEY)
            goto prepared;
        if (!PyBytes_CheckExact(data) && !PyList_CheckExact(data))
            goto prepared;
        PyObject *parts = PyBytes_CheckExact(data) ? PyTuple_Pack(1, data) : PySequence_Tuple(data);
        if (parts == NULL)
            goto done;
        f->first = held;
        int taken = 1;
        for (Py_ssize_t j = 0; j < PyTuple_GET_SIZE(parts) && taken; j++) {
            if (!room_for_one(&views, held, &capacity)) {
                Py_DECREF(parts);
                goto done;
            }
            taken = PyObject_GetBuffer(PyTuple_GET_ITEM(parts, j), &views[held], PyBUF_SIMPLE) == 0;
            if (taken) {
                f->size += views[held].len;
                f->n++;
                held++;
            } else
                PyErr_Clear(); /* (not a buffer: the caller's path says why) */
        }
        Py_DECREF(parts); /* (each held buffer holds its object) */
        if (!taken)
            goto prepared;
        f->small = PyBytes_CheckExact(data) && f->size <= small_max;
        if (!f->small && !(direct && f->size >= direct_from))
            goto prepared;
    }
prepared:
    for (Py_ssize_t i = 0; i < ready; i++)
        items[i].views = &views[items[i].first];
    Py_ssize_t published = 0;
    int error = 0, refused = 0;
    const char *step = "open";
    Direct d = {.fd = -1, .direct = 1, .staging = staging.buf, .capacity = staging.len, .align = align};
    const char *root = PyBytes_AS_STRING(root_path);
    Py_BEGIN_ALLOW_THREADS
    int root_fd = ready > 0 ? open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
    int folder = -1;
    const char *walked = NULL;
    for (; root_fd >= 0 && published < ready; published++) {
        File *f = &items[published];
        if (walked == NULL || strcmp(walked, f->folder) != 0) {
            if (folder >= 0 && folder != root_fd)
                close(folder);
            walked = NULL;
            folder = walk(root_fd, f->folder);
            if (folder < 0)
                break;
            walked = f->folder;
        }
        if (f->small) {
            Item item = {.tmp = f->tmp, .name = f->name, .data = f->views[0].buf, .size = f->size};
            step = "write";
            error = publish_one(folder, &item);
        } else {
            d.fill = d.mark = 0;
            d.count = 0;
            d.direct = 1;
            error = direct_file(&d, folder, f->tmp, f->name, f->views, f->n, f->size, flags, place_from, preallocate_from, &refused, &step);
        }
        if (error != 0)
            break;
    }
    if (folder >= 0 && folder != root_fd)
        close(folder);
    if (root_fd >= 0)
        close(root_fd);
    Py_END_ALLOW_THREADS
    PyObject *stop = NULL;
    if (refused)
        stop = PyUnicode_FromFormat("%s of %s: %s", step, items[published].name, strerror(error));
    else if (error != 0)
        stop = file_error(error, step, items[published].name);
    else {
        stop = Py_None;
        Py_INCREF(stop);
    }
    if (stop != NULL)
        result = Py_BuildValue("(nN)", published, stop);
done:
    for (Py_ssize_t i = 0; i < held; i++)
        PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    PyMem_Free(items);
    Py_XDECREF(entries);
    Py_DECREF(root_path);
    if (staging.obj != NULL)
        PyBuffer_Release(&staging);
    return result;
}
#endif

#if defined(O_DIRECT) && defined(__linux__)
/* inject_fault(where, errno, /): see the method table. */
static PyObject *
inject_fault(PyObject *module, PyObject *args)
{
    const char *where;
    int error;
    if (!PyArg_ParseTuple(args, "si:inject_fault", &where, &error))
        return NULL;
    int kind = strcmp(where, "open") == 0 ? FAULT_OPEN : strcmp(where, "write") == 0 ? FAULT_WRITE : strcmp(where, "short") == 0 ? FAULT_SHORT
             : strcmp(where, "short_aligned") == 0 ? FAULT_SHORT_ALIGNED : strcmp(where, "none") == 0 ? FAULT_NONE : -1; /* fmt: skip */
    if (kind < 0) {
        PyErr_Format(PyExc_ValueError, "inject_fault: %s is not open, write, short, short_aligned or none", where);
        return NULL;
    }
    fault = kind;
    fault_errno = error;
    Py_RETURN_NONE;
}
#endif

/* buffer_address(buffer, /) -> int: where a contiguous buffer's bytes start (the framer and
   the direct write ask it of each large part: a numpy view made to ask cost more). */
static PyObject *
buffer_address(PyObject *module, PyObject *arg)
{
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    PyObject *result = PyLong_FromVoidPtr(view.buf);
    PyBuffer_Release(&view);
    return result;
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
    {"buffer_address", buffer_address, METH_O, "buffer_address(buffer, /) -> int: where a contiguous buffer's bytes start in memory."},
    {"unnamed_files", unnamed_files, METH_NOARGS,
     "unnamed_files() -> bool: whether small files are published unnamed and linked in (O_TMPFILE) in this process."},
    {"publish_small", publish_small, METH_VARARGS,
     "publish_small(folder_fd, [(temporary name, name, bytes), ...]) -> (published, OSError or None): small files "
     "published in order, each written whole (unnamed and linked in where the file system allows, else under its "
     "temporary name and renamed over its name), the GIL released."},
    {"stage", stage, METH_VARARGS,
     "stage(into, fill, views, index, offset) -> (fill, index, offset): the views' bytes from views[index][offset:] on copied "
     "into into[fill:] until it is full or they are all copied (direct_io.write_direct's staging copy)."},
#if defined(O_DIRECT) && defined(__linux__)
    {"publish_direct", publish_direct, METH_VARARGS,
     "publish_direct(folder_fd, tmp, name, parts, staging, flags, align, place_from, preallocate_from, /) -> int or str: "
     "file `name` in the folder published whole from the buffers `parts`, written around the page cache (O_DIRECT) "
     "under the temporary name `tmp` (opened with `flags`), then renamed, the GIL released once: parts of `place_from` "
     "bytes or more on an `align`ed address at an aligned file offset written from where they are, the rest copied "
     "into `staging` (aligned, a multiple of `align`), the unaligned end through the page cache; extents reserved "
     "from `preallocate_from` bytes. The bytes written from where they were (not staged) once published; a string (what was refused) where the file system refused a direct write (the "
     "temporary removed: write the file the usual way); OSError for any other failure."},
    {"publish_files", publish_files, METH_VARARGS,
     "publish_files(root, [(folder, temporary name, name, data), ...], staging or None, flags, align, place_from, preallocate_from, "
     "direct_from, direct, small_max, /) -> (published, stop): files published in order below the folder `root`, the GIL "
     "released once: each `folder` (relative, \"\" for the root) walked from the root with O_NOFOLLOW, made where missing; "
     "`data` one bytes object of `small_max` bytes or less written as publish_small writes it, or (bytes or a list of "
     "buffers) of `direct_from` bytes or more, where `direct`, as publish_direct writes it (`staging` as there). Stops at the first file it "
     "cannot publish: `stop` None (a root or folder not walked, or a file neither small nor direct: for the caller's "
     "own path), a string (a direct write refused), or the OSError that failed the file."},
    {"inject_fault", inject_fault, METH_VARARGS,
     "inject_fault(where, errno, /): for tests, the next publish_direct fails at its open or its first direct write "
     "(\"open\", \"write\": with `errno`), or its first direct write is short by an unaligned amount (\"short\") or a "
     "whole number of blocks (\"short_aligned\"); "
     "\"none\" clears it."},
#endif
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

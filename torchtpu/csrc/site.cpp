// Python call sites for messages: debug mode names the line of every op, and
// defer_and_fuse's explain() names the line that cut each graph.
#include <Python.h>
#include <frameobject.h>

#include <mutex>
#include <string>

#include "adapter.h"

namespace torchtpu {

static bool is_library_file(const char* f) {
  return std::strstr(f, "/torch/") || std::strstr(f, "/torchtpu/") || std::strstr(f, "<frozen");
}

std::string python_call_site() {
  if (!Py_IsInitialized() || _Py_IsFinalizing()) return "";
  PyGILState_STATE gs = PyGILState_Ensure();
  std::string out;
  PyFrameObject* f = PyEval_GetFrame();  // borrowed
  Py_XINCREF(f);
  std::string fallback;
  while (f) {
    PyCodeObject* code = PyFrame_GetCode(f);  // new ref
    const char* file = PyUnicode_AsUTF8(code->co_filename);
    const char* name = PyUnicode_AsUTF8(code->co_name);
    int line = PyFrame_GetLineNumber(f);
    std::string here = std::string(file ? file : "?") + ":" + std::to_string(line) + " in " + (name ? name : "?");
    if (fallback.empty()) fallback = here;
    bool lib = file && is_library_file(file);
    Py_DECREF(code);
    if (!lib) { out = here; Py_DECREF(f); f = nullptr; break; }
    PyFrameObject* back = PyFrame_GetBack(f);  // new ref
    Py_DECREF(f);
    f = back;
  }
  if (PyErr_Occurred()) PyErr_Clear();
  PyGILState_Release(gs);
  return out.empty() ? fallback : out;
}

static std::mutex backward_mu;
static std::string backward_site;

void set_backward_site(const std::string& site) {
  std::lock_guard<std::mutex> g(backward_mu);
  backward_site = site;
}

void name_heuristic_cuts() {
  if (!tpu_explain_needs_site()) return;
  std::string site = python_call_site();
  if (site.empty()) {  // the autograd engine's thread: no Python frames
    std::lock_guard<std::mutex> g(backward_mu);
    site = backward_site.empty() ? "autograd engine" : "backward of " + backward_site;
  }
  tpu_explain_fill_site(site.c_str());
}

ScopedSite::ScopedSite(bool on) : active(on) {
  if (active) tpu_set_call_site(python_call_site().c_str());
}
ScopedSite::~ScopedSite() {
  if (active) tpu_set_call_site(nullptr);
}

}  // namespace torchtpu

#include "core/ops/device_ops.h"

#include <array>
#include <atomic>
#include <string>

#include "core/ops/internal/op_util.h"

namespace starling::ops {

namespace {
// One slot per DeviceType; written at install (before any op runs on that device).
std::array<std::atomic<DeviceOps*>, 2> g_tables{};

size_t slot(DeviceType type) { return static_cast<size_t>(type); }
}  // namespace

DeviceOps* device_ops(DeviceType type) {
  return slot(type) < g_tables.size() ? g_tables[slot(type)].load() : nullptr;
}

void install_device_ops(DeviceType type, DeviceOps* ops) {
  STARLING_OP_CHECK(slot(type) < g_tables.size() && type != DeviceType::kCPU, "install_device_ops",
                    "not a device type");
  g_tables[slot(type)].store(ops);
}

namespace internal {

bool any_on_device(std::initializer_list<const Tensor*> inputs) {
  for (const Tensor* t : inputs) {
    if (t != nullptr && t->defined() && !t->is_cpu()) return true;
  }
  return false;
}

DeviceOps& device_ops_for(const char* op, std::initializer_list<const Tensor*> inputs) {
  const Tensor* first = nullptr;
  for (const Tensor* t : inputs) {
    if (t == nullptr || !t->defined()) continue;
    if (first == nullptr) first = t;
    STARLING_OP_CHECK(t->device() == first->device(), op,
                      "inputs on different devices: " + device_str(first->device()) + " and " +
                          device_str(t->device()) + " (move them to one device first)");
    STARLING_OP_CHECK(!dtype_is_float(t->dtype()) || t->dtype() == DType::kF32, op,
                      std::string("runs on ") + device_str(t->device()) + " in f32 only, got " +
                          std::string(dtype_name(t->dtype())));
  }
  STARLING_OP_CHECK(first != nullptr, op, "no defined input");
  DeviceOps* ops = device_ops(first->device().type);
  STARLING_OP_CHECK(ops != nullptr, op,
                    "an input lives on " + device_str(first->device()) +
                        " but this build has no kernels for that device");
  return *ops;
}

}  // namespace internal

}  // namespace starling::ops

// All differentiable operations, one include for model code.
#pragma once

#include "core/autograd/autograd.h"
#include "core/ops/activation.h"
#include "core/ops/attention.h"
#include "core/ops/cross_entropy.h"
#include "core/ops/dropout.h"
#include "core/ops/elementwise.h"
#include "core/ops/embedding.h"
#include "core/ops/layer_norm.h"
#include "core/ops/matmul.h"
#include "core/ops/reduce.h"
#include "core/ops/rope.h"
#include "core/ops/softmax.h"

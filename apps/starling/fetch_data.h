// The dataset a federation config trains on, fetched with its pinned SHA-256 when the data
// folder lacks it (core/fetch/ensure.h; STARLING_NO_DOWNLOAD=1 turns this off).
#pragma once

#include "core/fetch/ensure.h"
#include "core/util/status.h"
#include "core/wire/federation.pb.h"

namespace starling::apps {

inline Status fetch_federation_data(const v1::FederationConfig& c) {
  if (c.model().arch() == v1::FedModelConfig::EXTERNAL) return ok_status();  // the user's data
  const auto options = fetch::ensure_options_from_env();
  if (c.data().tokenizer() == v1::DataConfig::GPT2) {
    RETURN_IF_ERROR(fetch::ensure_dataset(c.data().data_dir(), "gpt2", options).status());
  }
  auto name = fetch::catalog_name_for(c.data().dataset());
  if (!name.ok()) return ok_status();  // not a catalog dataset: the loader says what is wrong
  return fetch::ensure_dataset(c.data().data_dir(), *name, options).status();
}

}  // namespace starling::apps

// `starling client --check`: what an operator runs on a new device before it joins. Each check
// says what it looked at and, when it fails, what to fix.
#pragma once

#include <asio/io_context.hpp>
#include <asio/ssl/context.hpp>
#include <chrono>
#include <memory>
#include <string>

#include "core/net/client.h"
#include "core/net/tls.h"
#include "core/util/status.h"

namespace starling::edge_client {

// The node certificate against the CA (and CRL when given): chain, validity period, client
// use, and that the key matches. OK's detail: "CN=..., role ..., expires in N days".
Result<std::string> check_node_certificate(const net::TlsConfig& tls, std::string_view node_id);

// Connects to the aggregator, exchanges Hello messages and leaves: proves the address, both
// certificates and the protocol version agree. Returns "aggregator <id> at host:port".
Result<std::string> probe_aggregator(std::shared_ptr<asio::ssl::context> ctx,
                                     net::ClientOptions options, const std::string& node_id,
                                     std::chrono::milliseconds timeout);

}  // namespace starling::edge_client

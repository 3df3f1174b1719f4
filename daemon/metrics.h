// /metrics: the daemon's counters in Prometheus text format (exposition format 0.0.4), served over
// HTTP by kj-http on --metrics-addr.
#pragma once

#include <kj/compat/http.h>

#include <functional>
#include <string>

namespace kvtier {

// Serves GET /metrics with the text `render` returns; anything else is 404.
class MetricsService final : public kj::HttpService {
 public:
  MetricsService(const kj::HttpHeaderTable& headers, std::function<std::string()> render)
      : headers_(headers), render_(std::move(render)) {}
  kj::Promise<void> request(kj::HttpMethod method, kj::StringPtr url,
                            const kj::HttpHeaders& headers, kj::AsyncInputStream& body,
                            Response& response) override;

 private:
  const kj::HttpHeaderTable& headers_;
  std::function<std::string()> render_;
};

// Appends a metric's HELP and TYPE lines to `out`: the caller adds its labelled samples.
void appendMetricHeader(std::string& out, const char* name, const char* type, const char* help);
// Appends one metric (HELP, TYPE and value lines) to `out`.
void appendMetric(std::string& out, const char* name, const char* type, const char* help,
                  uint64_t value);

}  // namespace kvtier

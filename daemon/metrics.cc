#include "daemon/metrics.h"

namespace kvtier {

void appendMetricHeader(std::string& out, const char* name, const char* type, const char* help) {
  out += "# HELP ";
  out += name;
  out += ' ';
  out += help;
  out += "\n# TYPE ";
  out += name;
  out += ' ';
  out += type;
  out += '\n';
}

void appendMetric(std::string& out, const char* name, const char* type, const char* help,
                  uint64_t value) {
  appendMetricHeader(out, name, type, help);
  out += name;
  out += ' ';
  out += std::to_string(value);
  out += '\n';
}

kj::Promise<void> MetricsService::request(kj::HttpMethod method, kj::StringPtr url,
                                          const kj::HttpHeaders&, kj::AsyncInputStream&,
                                          Response& response) {
  kj::HttpHeaders out(headers_);
  if (method != kj::HttpMethod::GET || (url != "/metrics" && !url.startsWith("/metrics?"))) {
    out.set(kj::HttpHeaderId::CONTENT_TYPE, "text/plain");
    auto stream = response.send(404, "Not Found", out, uint64_t{10});
    return stream->write("not found\n", 10).attach(kj::mv(stream));
  }
  auto body = kj::heapString(render_().c_str());
  out.set(kj::HttpHeaderId::CONTENT_TYPE, "text/plain; version=0.0.4");
  auto stream = response.send(200, "OK", out, uint64_t{body.size()});
  auto write = stream->write(body.begin(), body.size());
  return write.attach(kj::mv(stream), kj::mv(body));
}

}  // namespace kvtier

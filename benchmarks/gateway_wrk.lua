-- wrk's script for benchmarks/gateway_bench.py: every request a POST of one body (read from the
-- file named by the first argument after `--`), with the headers the other arguments give
-- ("name: value"); at the end, one line `gateway-bench {json}`: the counts, and the latency
-- (microseconds) at every half percentile from 0.5 to 99.5, which the benchmark pools over its
-- slices, each weighted by its requests.

function init(args)
   local file = assert(io.open(args[1], "rb"))
   wrk.body = file:read("*a")
   file:close()
   wrk.method = "POST"
   wrk.headers["Content-Type"] = "application/json"
   for i = 2, #args do
      local name, value = args[i]:match("^([^:]+):%s*(.*)$")
      wrk.headers[name] = value
   end
end

function done(summary, latency, requests)
   local points = {}
   for q = 1, 199 do
      points[#points + 1] = string.format("%d", latency:percentile(q / 2))
   end
   local errors = summary.errors
   io.write(string.format(
      'gateway-bench {"requests":%d,"duration_us":%d,"bytes":%d,"errors":{"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d},"quantiles_us":[%s]}\n',
      summary.requests, summary.duration, summary.bytes, errors.connect, errors.read, errors.write,
      errors.status, errors.timeout, table.concat(points, ",")))
end

package middleware

// DefaultKeep is the default Options.Keep: it reports whether a response
// with this status is an answer that a retry of the same request cannot
// change, and is therefore recorded and replayed. It keeps 2xx and 3xx
// (the work was done; its answer, or where to find its result) and the
// 4xx that find fault with what the fingerprint covers (the method, the
// request target, the content type and the body): 400, 410, 413, 414, 415
// and 422. It keeps no answer that says the work did not happen and may
// happen on a later try: no 5xx, no other 4xx (credentials, routing,
// timing, the state of the resource or of something else, and the
// refusals of a header the fingerprint does not cover: 406, 411, 417,
// 428, 431, which a retry with the header fixed must not get again), no
// status of unknown meaning. None of the statuses the
// client package's transport retries (409, 429, 500, 502, 503, 504) is
// kept. The table of Keep rules in the package documentation gives each
// status and why.
//
// A Keep that extends it: func(s int) bool { return s == 402 || middleware.DefaultKeep(s) }.
func DefaultKeep(status int) bool {
	switch {
	case 200 <= status && status < 400:
		return true
	}
	switch status {
	case 400, // Bad Request: the request is malformed
		410, // Gone: for good, unlike 404
		413, // Content Too Large
		414, // URI Too Long
		415, // Unsupported Media Type
		422: // Unprocessable Content: the request is invalid
		return true
	}
	return false
}

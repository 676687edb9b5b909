package compute

import (
	"net/http"
	"strings"

	"github.com/better-compute/compute/api"
)

// isReleaseUpload: the request uploads a build of bcd (releases.UploadHandler), however the
// handler is mounted.
func isReleaseUpload(r *http.Request) bool {
	return strings.TrimPrefix(r.URL.Path, api.BasePath) == api.ReleaseUploadPath
}

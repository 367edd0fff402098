// Package version says which build of Tenure this is.
package version

import (
	"runtime"
	"runtime/debug"
)

// Version is set at link time for a release:
//
//	go build -ldflags "-X github.com/tenure-io/tenure/internal/version.Version=v1.2.0" ./cmd/tenure
//
// Empty: the module version from the build information, or "devel".
var Version string

// String is this build's version: Version, else the main module's version
// (as `go install module@version` records it), else "devel", with the
// VCS revision when the build recorded one ("devel+1a2b3c4d5e6f").
func String() string {
	if Version != "" {
		return Version
	}
	v := "devel"
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return v
	}
	if mv := bi.Main.Version; mv != "" && mv != "(devel)" {
		return mv
	}
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" && len(s.Value) >= 12 {
			v += "+" + s.Value[:12]
		}
	}
	return v
}

// Go is the Go release this build was made with.
func Go() string { return runtime.Version() }

// Files that survive a crash, and bounded reads of files a user names.
//
// WriteFileAtomically is the write half of the checkpoint store's
// crash-consistency argument: after it returns OK the file is on disk under
// its final name with all its bytes (temporary file, write, fsync, rename,
// fsync of the directory); after a crash at any moment before that, the
// final name holds either nothing or its previous complete content, never a
// torn file. A temporary file left behind by a crash carries
// kTempFileMarker in its name so that cleanups can find it.
//
// ReadRegularFile reads only regular files (not FIFOs, devices or
// directories, which could block or never end) up to a size cap, so a
// path from a user cannot make the caller hang or allocate without bound.
//
// Free functions; thread-safe as far as the filesystem is (two writers of
// one path race, the last rename wins).
#ifndef PIPETRAIN_COMMON_DURABLE_FILE_H_
#define PIPETRAIN_COMMON_DURABLE_FILE_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pipetrain {

// Part of the name of every temporary file WriteFileAtomically creates.
inline constexpr absl::string_view kTempFileMarker = ".tmp-";

// Receives the content in pieces; returns an error to stop.
using ByteSink = std::function<absl::Status(absl::string_view piece)>;

// Writes `path` atomically and durably with what `produce` hands to the
// sink it is given. The directory of `path` must exist. Errors (the
// temporary file is removed): whatever `produce` returned, or Unavailable
// naming the path and the failed system call.
absl::Status WriteFileAtomically(
    const std::string& path,
    const std::function<absl::Status(const ByteSink& sink)>& produce);

// The same with the whole content at hand.
absl::Status WriteFileAtomically(const std::string& path,
                                 absl::string_view content);

// Creates `dir` and its missing parents, and makes each directory it
// created durable (fsync of its parent). Unavailable naming the path on
// failure, FailedPrecondition when something that is not a directory is in
// the way.
absl::Status CreateDirectoriesDurably(const std::string& dir);

// fsync of a directory, so that entries created, renamed or removed in it
// survive a crash. Unavailable naming the path on failure.
absl::Status SyncDirectory(const std::string& dir);

// The content of the regular file at `path`. NotFound when it does not
// exist; InvalidArgument when it is not a regular file or is larger than
// `max_bytes`; Unavailable for other I/O errors. Messages name the path.
absl::StatusOr<std::string> ReadRegularFile(const std::string& path,
                                            uint64_t max_bytes);

}  // namespace pipetrain

#endif  // PIPETRAIN_COMMON_DURABLE_FILE_H_

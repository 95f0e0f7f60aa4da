// What a caller should do about a SQLite result code (house rule 3), for
// every SQLite store of the scheduler: kUnavailable for I/O, busy, locked,
// full or cannot-open (retry), kDataLoss for a corrupt or foreign file,
// kInternal otherwise.
#ifndef PIPETRAIN_SCHEDULER_SQLITE_STATUS_H_
#define PIPETRAIN_SCHEDULER_SQLITE_STATUS_H_

#include <sqlite3.h>

#include "absl/status/status.h"

namespace pipetrain {

inline absl::StatusCode SqliteStatusCode(int rc) {
  switch (rc & 0xff) {  // primary code of an extended one
    case SQLITE_IOERR:
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
    case SQLITE_CANTOPEN:
    case SQLITE_FULL:
    case SQLITE_PROTOCOL:
      return absl::StatusCode::kUnavailable;
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB:
      return absl::StatusCode::kDataLoss;
    default:
      return absl::StatusCode::kInternal;
  }
}

}  // namespace pipetrain

#endif  // PIPETRAIN_SCHEDULER_SQLITE_STATUS_H_

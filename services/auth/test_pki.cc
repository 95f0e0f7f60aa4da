#include "services/auth/test_pki.h"

#include <cstdlib>
#include <fstream>

#include "absl/strings/str_cat.h"

namespace pipetrain {
namespace {

absl::Status Run(const std::string& command) {
  const std::string quiet = absl::StrCat(command, " >/dev/null 2>&1");
  if (std::system(quiet.c_str()) != 0) {
    return absl::InternalError(absl::StrCat("failed: ", command));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<TestPki> TestPki::Create(const std::string& dir,
                                        const std::string& ca_name) {
  TestPki pki;
  pki.dir_ = dir;
  pki.ca_cert_ = absl::StrCat(dir, "/", ca_name, ".crt");
  pki.ca_key_ = absl::StrCat(dir, "/", ca_name, ".key");
  absl::Status made = Run(absl::StrCat(
      "openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 "
      "-nodes -days 2 -subj /CN=",
      ca_name, " -keyout ", pki.ca_key_, " -out ", pki.ca_cert_));
  if (!made.ok()) return made;
  return pki;
}

absl::StatusOr<CertFiles> TestPki::Issue(const std::string& common_name) const {
  const std::string base = absl::StrCat(dir_, "/", common_name);
  CertFiles files{base + ".crt", base + ".key", ca_cert_};
  std::ofstream(base + ".ext")
      << "subjectAltName=DNS:localhost,IP:127.0.0.1,DNS:" << common_name
      << "\nextendedKeyUsage=serverAuth,clientAuth\n";
  absl::Status made = Run(absl::StrCat(
      "openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
      "-subj /CN=",
      common_name, " -keyout ", files.key, " -out ", base, ".csr"));
  if (!made.ok()) return made;
  made = Run(absl::StrCat("openssl x509 -req -in ", base, ".csr -CA ", ca_cert_,
                          " -CAkey ", ca_key_,
                          " -CAcreateserial -days 2 -extfile ", base,
                          ".ext -out ", files.cert));
  if (!made.ok()) return made;
  return files;
}

}  // namespace pipetrain

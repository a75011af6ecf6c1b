# Runs inside `cmake --install` (install(CODE) in packaging/CMakeLists.txt): installs the
# systemd unit and the example config for the prefix the files actually go to, which
# `cmake --install --prefix P` may change after configuration. So the unit is generated
# here, not at configure time.
#
# In:  KVT_SRC_DIR (packaging/), KVT_OUT_DIR (a scratch directory in the build tree),
#      KVT_BINDIR, KVT_SYSCONFDIR, KVT_DOCDIR, KVT_UNITDIR: directories relative to the
#      prefix (or absolute), as GNUInstallDirs and KVT_SYSTEMD_UNITDIR give them.
# Uses CMAKE_INSTALL_PREFIX (the install-time prefix); DESTDIR is applied by file(INSTALL).

# kvt_full_dir(<out> <dir> [SYSCONF]): <dir> made absolute for the install prefix, with
# GNUInstallDirs' rule for the configuration directory: /etc for the prefixes / and /usr,
# /etc/opt/<name> for /opt/<name>.
function(kvt_full_dir out dir)
  if(IS_ABSOLUTE "${dir}")
    set(full "${dir}")
  elseif(ARGN STREQUAL "SYSCONF" AND CMAKE_INSTALL_PREFIX MATCHES "^/(usr/?)?$")
    set(full "/${dir}")
  elseif(ARGN STREQUAL "SYSCONF" AND CMAKE_INSTALL_PREFIX MATCHES "^/opt/(.+)$")
    set(full "/${dir}/opt/${CMAKE_MATCH_1}")
  else()
    set(full "${CMAKE_INSTALL_PREFIX}/${dir}")
  endif()
  string(REGEX REPLACE "//+" "/" full "${full}")
  string(REGEX REPLACE "(.)/$" "\\1" full "${full}")
  set(${out} "${full}" PARENT_SCOPE)
endfunction()

kvt_full_dir(KVT_UNIT_BINDIR "${KVT_BINDIR}")
kvt_full_dir(sysconfdir "${KVT_SYSCONFDIR}" SYSCONF)
set(KVT_UNIT_CONFDIR "${sysconfdir}/kvtier")
kvt_full_dir(KVT_UNIT_DOCDIR "${KVT_DOCDIR}")
kvt_full_dir(unitdir "${KVT_UNITDIR}")

configure_file("${KVT_SRC_DIR}/kvtierd.service.in" "${KVT_OUT_DIR}/kvtierd.service" @ONLY)
file(INSTALL DESTINATION "${unitdir}" TYPE FILE FILES "${KVT_OUT_DIR}/kvtierd.service")

# The config is the admin's once installed: a reinstall or upgrade keeps an existing
# file (as dpkg does with conffiles). The pristine example is in the doc directory.
set(conf "${KVT_UNIT_CONFDIR}/kvtierd.conf")
if(EXISTS "$ENV{DESTDIR}${conf}")
  message(STATUS "Keeping: $ENV{DESTDIR}${conf} (the example: ${KVT_UNIT_DOCDIR}/examples/kvtierd.conf)")
else()
  file(INSTALL DESTINATION "${KVT_UNIT_CONFDIR}" TYPE FILE
       PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ
       FILES "${KVT_SRC_DIR}/kvtierd.conf")
endif()

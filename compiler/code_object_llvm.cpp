// The code-object readers of the LLVM plugin: LLVM's ELF reader, MC
// disassembler and msgpack Document, all in-process. Reached through
// compiler::disassemble and compiler::read_resources (code_object.h).
#include "compiler/code_object.h"
#include "compiler/llvm_impl.h"

#include "target/arch.h"

#include <fmt/format.h>

#include <llvm/BinaryFormat/ELF.h>
#include <llvm/BinaryFormat/MsgPackDocument.h>
#include <llvm/MC/MCAsmInfo.h>
#include <llvm/MC/MCContext.h>
#include <llvm/MC/MCDisassembler/MCDisassembler.h>
#include <llvm/MC/MCInst.h>
#include <llvm/MC/MCInstPrinter.h>
#include <llvm/MC/MCInstrInfo.h>
#include <llvm/MC/MCRegisterInfo.h>
#include <llvm/MC/MCSubtargetInfo.h>
#include <llvm/MC/MCTargetOptions.h>
#include <llvm/MC/TargetRegistry.h>
#include <llvm/Object/ELFObjectFile.h>
#include <llvm/Object/ObjectFile.h>
#include <llvm/Support/raw_ostream.h>

#include <map>
#include <memory>

#include <algorithm>

namespace flashjit::compiler {

namespace {

/// The code object opened with LLVM, with its kernels' metadata.
struct Opened {
  std::unique_ptr<llvm::object::ObjectFile> file;
  const llvm::object::ELF64LEObjectFile *elf = nullptr;
  std::string cpu;
  std::vector<ResourceReport> kernels; // metadata fields only
};

Status bad(const CodeObject &code, const std::string &why) {
  return Status::error("code object for {}: {}", code.arch, why);
}

int64_t as_int(llvm::msgpack::DocNode node) {
  switch (node.getKind()) {
  case llvm::msgpack::Type::Int:
    return node.getInt();
  case llvm::msgpack::Type::UInt:
    return static_cast<int64_t>(node.getUInt());
  case llvm::msgpack::Type::Boolean:
    return node.getBool() ? 1 : 0;
  default:
    return 0;
  }
}

/// The fields of one amdhsa.kernels[] entry (AMDGPUUsage.rst, "Code Object V3+ Metadata").
ResourceReport kernel_metadata(llvm::msgpack::MapDocNode &map) {
  auto integer = [&](llvm::StringRef key) -> int64_t {
    auto it = map.find(key);
    return it == map.end() ? 0 : as_int(it->second);
  };
  auto string = [&](llvm::StringRef key) -> std::string {
    auto it = map.find(key);
    return it == map.end() || !it->second.isString() ? std::string() : it->second.getString().str();
  };
  ResourceReport r;
  r.kernel = string(".name");
  r.symbol = string(".symbol");
  r.vgprs = static_cast<int>(integer(".vgpr_count"));
  r.sgprs = static_cast<int>(integer(".sgpr_count"));
  r.agprs = static_cast<int>(integer(".agpr_count"));
  r.vgpr_spill_count = static_cast<int>(integer(".vgpr_spill_count"));
  r.sgpr_spill_count = static_cast<int>(integer(".sgpr_spill_count"));
  r.vgpr_spill = r.vgpr_spill_count > 0;
  r.sgpr_spill = r.sgpr_spill_count > 0;
  r.private_segment_bytes = integer(".private_segment_fixed_size");
  r.group_segment_bytes = integer(".group_segment_fixed_size");
  r.wavefront_size = static_cast<int>(integer(".wavefront_size"));
  r.max_flat_workgroup_size = static_cast<int>(integer(".max_flat_workgroup_size"));
  return r;
}

Expected<std::vector<ResourceReport>> read_metadata(const CodeObject &code,
                                                    const llvm::object::ELF64LEObjectFile &elf) {
  const auto &file = elf.getELFFile();
  auto sections = file.sections();
  if (!sections)
    return bad(code, llvm::toString(sections.takeError()));
  for (const auto &section : *sections) {
    if (section.sh_type != llvm::ELF::SHT_NOTE)
      continue;
    llvm::Error error = llvm::Error::success();
    for (const auto &note : file.notes(section, error)) {
      if (note.getName() != "AMDGPU" || note.getType() != llvm::ELF::NT_AMDGPU_METADATA)
        continue;
      llvm::msgpack::Document doc;
      if (!doc.readFromBlob(note.getDescAsStringRef(section.sh_addralign), /*Multi=*/false) ||
          !doc.getRoot().isMap()) {
        llvm::consumeError(std::move(error));
        return bad(code, "unreadable AMDGPU metadata note");
      }
      std::vector<ResourceReport> kernels;
      llvm::msgpack::MapDocNode root = doc.getRoot().getMap();
      auto list = root.find("amdhsa.kernels");
      if (list != root.end() && list->second.isArray())
        for (llvm::msgpack::DocNode &entry : list->second.getArray())
          if (entry.isMap()) {
            llvm::msgpack::MapDocNode map = entry.getMap();
            kernels.push_back(kernel_metadata(map));
          }
      llvm::consumeError(std::move(error));
      return kernels;
    }
    if (error)
      return bad(code, llvm::toString(std::move(error)));
  }
  return bad(code, "no NT_AMDGPU_METADATA note (not an AMDHSA code object?)");
}

Expected<Opened> open(const CodeObject &code) {
  llvm::MemoryBufferRef buffer(
      llvm::StringRef(reinterpret_cast<const char *>(code.bytes.data()), code.bytes.size()),
      "code object");
  auto file = llvm::object::ObjectFile::createObjectFile(buffer);
  if (!file)
    return bad(code, "not an ELF file: " + llvm::toString(file.takeError()));
  Opened opened;
  opened.file = std::move(*file);
  opened.elf = llvm::dyn_cast<llvm::object::ELF64LEObjectFile>(opened.file.get());
  if (!opened.elf || opened.elf->getArch() != llvm::Triple::amdgcn)
    return bad(code, "not an AMDGPU (amdgcn) ELF file");
  opened.cpu = code.arch;
  if (auto cpu = opened.elf->tryGetCPUName(); cpu && !cpu->empty())
    opened.cpu = cpu->str();
  auto kernels = read_metadata(code, *opened.elf);
  if (!kernels)
    return kernels.status();
  opened.kernels = kernels.take();
  return opened;
}

/// LLVM's MC layer for one processor.
struct Mc {
  llvm::Triple triple;
  std::unique_ptr<llvm::MCRegisterInfo> registers;
  std::unique_ptr<llvm::MCAsmInfo> asm_info;
  std::unique_ptr<llvm::MCSubtargetInfo> subtarget;
  std::unique_ptr<llvm::MCInstrInfo> instructions;
  std::unique_ptr<llvm::MCContext> context;
  std::unique_ptr<llvm::MCDisassembler> disassembler;
  std::unique_ptr<llvm::MCInstPrinter> printer;
};

Expected<std::unique_ptr<Mc>> make_mc(const CodeObject &code, const Opened &opened) {
  llvm_impl::initialize_targets();
  auto mc = std::make_unique<Mc>();
  mc->triple = opened.elf->makeTriple();
  std::string error;
  const llvm::Target *target = llvm::TargetRegistry::lookupTarget(mc->triple, error);
  if (!target)
    return bad(code, error);
  // The disassembler decodes register tuples by wave size: tell it about wave64
  // code, for chips that default to wave32 (on the others it changes nothing).
  bool wave64 = std::any_of(opened.kernels.begin(), opened.kernels.end(),
                            [](const ResourceReport &k) { return k.wavefront_size == 64; });
  std::string features = wave64 ? "+wavefrontsize64" : "";
  llvm::MCTargetOptions options;
  mc->registers.reset(target->createMCRegInfo(mc->triple));
  mc->asm_info.reset(target->createMCAsmInfo(*mc->registers, mc->triple, options));
  mc->subtarget.reset(target->createMCSubtargetInfo(mc->triple, opened.cpu, features));
  mc->instructions.reset(target->createMCInstrInfo());
  if (!mc->registers || !mc->asm_info || !mc->subtarget || !mc->instructions)
    return bad(code, "LLVM has no MC support for " + opened.cpu);
  mc->context = std::make_unique<llvm::MCContext>(mc->triple, mc->asm_info.get(),
                                                  mc->registers.get(), mc->subtarget.get());
  mc->disassembler.reset(target->createMCDisassembler(*mc->subtarget, *mc->context));
  mc->printer.reset(target->createMCInstPrinter(mc->triple, mc->asm_info->getAssemblerDialect(),
                                                *mc->asm_info, *mc->instructions, *mc->registers));
  if (!mc->disassembler || !mc->printer)
    return bad(code, "LLVM has no disassembler for " + opened.cpu);
  return mc;
}

struct Symbol {
  uint64_t address = 0, size = 0;
  std::string name;
};

struct Instruction {
  uint64_t address = 0;
  std::string text; // as the MC printer prints it, without leading whitespace
  llvm::ArrayRef<uint8_t> bytes;
};

struct Section {
  std::string name;
  std::vector<Instruction> instructions;
};

/// Function symbols of the executable sections, from .symtab and .dynsym, by address.
std::vector<Symbol> function_symbols(const Opened &opened) {
  std::map<std::pair<uint64_t, std::string>, uint64_t> unique;
  auto add = [&](const llvm::object::ELFSymbolRef &symbol) {
    auto type = symbol.getType();
    auto name = symbol.getName();
    auto address = symbol.getAddress();
    if (!type || !name || !address || *type != llvm::object::SymbolRef::ST_Function) {
      if (!type)
        llvm::consumeError(type.takeError());
      if (!name)
        llvm::consumeError(name.takeError());
      if (!address)
        llvm::consumeError(address.takeError());
      return;
    }
    unique[{*address, name->str()}] = symbol.getSize();
  };
  for (const llvm::object::ELFSymbolRef &symbol : opened.elf->symbols())
    add(symbol);
  for (const llvm::object::ELFSymbolRef &symbol : opened.elf->getDynamicSymbolIterators())
    add(symbol);
  std::vector<Symbol> symbols;
  for (const auto &[key, size] : unique)
    symbols.push_back({key.first, size, key.second});
  return symbols;
}

Expected<std::vector<Section>> decode(const CodeObject &code, const Opened &opened, Mc &mc) {
  std::vector<Section> sections;
  for (const llvm::object::SectionRef &section : opened.file->sections()) {
    if (!section.isText() || section.getSize() == 0)
      continue;
    auto name = section.getName();
    auto contents = section.getContents();
    if (!name || !contents) {
      std::string why = !name ? llvm::toString(name.takeError()) : "";
      if (!contents)
        why += llvm::toString(contents.takeError());
      return bad(code, why);
    }
    Section out;
    out.name = name->str();
    llvm::ArrayRef<uint8_t> bytes(reinterpret_cast<const uint8_t *>(contents->data()),
                                  contents->size());
    uint64_t base = section.getAddress();
    for (uint64_t offset = 0; offset < bytes.size();) {
      llvm::MCInst inst;
      uint64_t size = 0;
      std::string comments, text;
      llvm::raw_string_ostream comments_os(comments), text_os(text);
      auto status = mc.disassembler->getInstruction(inst, size, bytes.slice(offset), base + offset,
                                                    comments_os);
      if (status == llvm::MCDisassembler::Success && size > 0) {
        mc.printer->printInst(&inst, base + offset, "", *mc.subtarget, text_os);
      } else {
        size = std::min<uint64_t>(4, bytes.size() - offset);
        text_os << "<unknown>";
      }
      text_os.flush();
      size_t first = text.find_first_not_of(" \t");
      text = first == std::string::npos ? std::string() : text.substr(first);
      std::replace(text.begin(), text.end(), '\t', ' ');
      out.instructions.push_back({base + offset, std::move(text), bytes.slice(offset, size)});
      offset += size;
    }
    sections.push_back(std::move(out));
  }
  return sections;
}

/// A code object opened, its instructions decoded and its function symbols
/// listed: what both readers start from.
struct Decoded {
  Opened opened;
  std::vector<Section> sections;
  std::vector<Symbol> symbols;
};

Expected<Decoded> open_and_decode(const CodeObject &code) {
  auto opened = open(code);
  if (!opened)
    return opened.status();
  auto mc = make_mc(code, *opened);
  if (!mc)
    return mc.status();
  auto sections = decode(code, *opened, **mc);
  if (!sections)
    return sections.status();
  std::vector<Symbol> symbols = function_symbols(*opened);
  return Decoded{opened.take(), sections.take(), std::move(symbols)};
}

} // namespace

namespace llvm_impl {

Expected<std::string> disassemble(const CodeObject &code) {
  auto decoded = open_and_decode(code);
  if (!decoded)
    return decoded.status();
  const std::vector<Section> &sections = decoded->sections;
  const std::vector<Symbol> &symbols = decoded->symbols;

  // The layout of llvm-objdump -d for AMDGPU: the instruction left-justified in
  // 60 columns (tab included), then its address and encoding as a comment.
  std::string out;
  for (const Section &section : sections) {
    out += fmt::format("Disassembly of section {}:\n", section.name);
    for (const Instruction &inst : section.instructions) {
      for (const Symbol &symbol : symbols)
        if (symbol.address == inst.address)
          out += fmt::format("\n{:016x} <{}>:\n", symbol.address, symbol.name);
      std::string line = "\t" + inst.text;
      line.resize(std::max<size_t>(line.size() + 1, 60), ' ');
      line += fmt::format("// {:012X}:", inst.address);
      for (size_t i = 0; i + 4 <= inst.bytes.size(); i += 4)
        line += fmt::format(" {:08X}", uint32_t(inst.bytes[i]) | uint32_t(inst.bytes[i + 1]) << 8 |
                                           uint32_t(inst.bytes[i + 2]) << 16 |
                                           uint32_t(inst.bytes[i + 3]) << 24);
      for (size_t i = inst.bytes.size() / 4 * 4; i < inst.bytes.size(); ++i)
        line += fmt::format(" {:02X}", inst.bytes[i]);
      out += line + "\n";
    }
  }
  return out;
}

Expected<std::vector<ResourceReport>> read_resources(const CodeObject &code, int vgpr_file_per_simd,
                                                     int max_waves_per_simd,
                                                     int lds_bytes_per_cu_or_wgp) {
  auto decoded = open_and_decode(code);
  if (!decoded)
    return decoded.status();
  const Opened &opened = decoded->opened;
  const std::vector<Section> &sections = decoded->sections;
  const std::vector<Symbol> &symbols = decoded->symbols;

  // The VGPR granule and the SGPR rule are the processor's row of the arch facts.
  const target::Arch *arch = target::find_arch(target::processor_of(opened.cpu));
  if (arch == nullptr)
    return bad(code, fmt::format("no arch facts for processor '{}': supported are {}", opened.cpu,
                                 target::arch_list()));
  const bool sgprs_limit = arch->facts().sgprs_limit_occupancy;
  std::vector<ResourceReport> reports = opened.kernels;
  for (ResourceReport &r : reports) {
    // The kernel's code is the function symbol named like its descriptor without ".kd".
    std::string function = r.symbol.size() > 3 && r.symbol.ends_with(".kd")
                               ? r.symbol.substr(0, r.symbol.size() - 3)
                               : r.kernel;
    for (const Symbol &symbol : symbols) {
      if (symbol.name != function)
        continue;
      for (const Section &section : sections)
        for (const Instruction &inst : section.instructions)
          if (inst.address >= symbol.address && inst.address < symbol.address + symbol.size &&
              is_matrix_instruction(inst.text))
            ++r.matrix_instructions;
      break;
    }
    r.vgpr_alloc_granule = arch->vgpr_alloc_granule(r.wavefront_size);
    r.occupancy_waves_per_simd =
        occupancy(r, sgprs_limit, vgpr_file_per_simd, max_waves_per_simd, lds_bytes_per_cu_or_wgp);
  }
  return reports;
}

} // namespace llvm_impl

} // namespace flashjit::compiler
